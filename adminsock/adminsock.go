// Package adminsock is the agent's admin socket: a local HTTP API over a
// unix socket (mode 0600) that serves the supervisor's status and its cell
// controls (drain, undrain, restart, runtime upgrade, shutdown), and the
// client the CLI asks it with. It speaks the supervisor's types (Status,
// SlotStatus, UpgradePlan) and maps its control errors to answers; the
// supervisor knows nothing of it. agent and cmd/cellvisor import it.
package adminsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"

	"cellvisor/supervisor"
)

// Controller is what the admin socket serves.
type Controller interface {
	LiveStatus(ctx context.Context) supervisor.Status
	Drain(ctx context.Context, cell string) (supervisor.SlotStatus, error)
	Undrain(ctx context.Context, cell string) (supervisor.SlotStatus, error)
	Restart(ctx context.Context, cell string) (supervisor.SlotStatus, error)
}

// Shutdowner is what the admin socket's POST /v1/shutdown calls, when the
// Controller implements it: stop every cell gracefully and end the agent
// (cellvisor shutdown). It returns once the stop is under way.
type Shutdowner interface {
	Shutdown(ctx context.Context) error
}

// RuntimeUpgrader is what the admin socket's POST /v1/runtime/upgrade
// calls, when the Controller implements it (cellvisor upgrade-runtime;
// ?dry_run=1 changes nothing).
type RuntimeUpgrader interface {
	UpgradeRuntime(ctx context.Context, dryRun bool) (supervisor.UpgradePlan, error)
}

// ShutdownAnswer is the answer to POST /v1/shutdown.
type ShutdownAnswer struct {
	PID int `json:"pid"`
}

// Server serves the agent's status and cell controls on a local unix
// socket (mode 0600: whoever may open it is the agent's operator).
type Server struct {
	srv  *http.Server
	ln   net.Listener
	path string
}

// apiError is an error with the HTTP status to answer it with.
type apiError struct {
	Status int
	Err    error
}

func (e *apiError) Error() string { return e.Err.Error() }
func (e *apiError) Unwrap() error { return e.Err }

// handlerFunc is an admin handler; one place turns its error into an answer.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func serve(log *zap.Logger, h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, supervisor.ErrNoSlot):
			status = http.StatusNotFound
		case errors.Is(err, supervisor.ErrNotRunning):
			status = http.StatusConflict
		case errors.Is(err, supervisor.ErrRateLimited):
			status = http.StatusTooManyRequests
		}
		var ae *apiError
		if errors.As(err, &ae) {
			status = ae.Status
		}
		if status == http.StatusInternalServerError {
			log.Error("admin request failed", zap.String("path", r.URL.Path), zap.Error(err))
		}
		writeJSON(w, status, map[string]string{"error": err.Error()})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Listen binds the admin socket, refusing when another agent answers on
// it and replacing a stale one. Nothing is served until Serve.
func Listen(path string, ctl Controller, log *zap.Logger) (*Server, error) {
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("admin socket %s: another agent is running", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", serve(log, func(w http.ResponseWriter, r *http.Request) error {
		writeJSON(w, http.StatusOK, ctl.LiveStatus(r.Context()))
		return nil
	}))
	for verb, do := range map[string]func(context.Context, string) (supervisor.SlotStatus, error){
		"drain": ctl.Drain, "undrain": ctl.Undrain, "restart": ctl.Restart,
	} {
		mux.HandleFunc("POST /v1/cells/{cell}/"+verb, serve(log, func(w http.ResponseWriter, r *http.Request) error {
			st, err := do(r.Context(), r.PathValue("cell"))
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, st)
			return nil
		}))
	}
	if up, ok := ctl.(RuntimeUpgrader); ok {
		mux.HandleFunc("POST /v1/runtime/upgrade", serve(log, func(w http.ResponseWriter, r *http.Request) error {
			plan, err := up.UpgradeRuntime(r.Context(), r.URL.Query().Get("dry_run") == "1")
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, plan)
			return nil
		}))
	}
	if sd, ok := ctl.(Shutdowner); ok {
		mux.HandleFunc("POST /v1/shutdown", serve(log, func(w http.ResponseWriter, r *http.Request) error {
			if err := sd.Shutdown(r.Context()); err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, ShutdownAnswer{PID: os.Getpid()})
			return nil
		}))
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// A restart waits for requests in flight (up to the drain timeout)
		// and a new cell's readiness.
		WriteTimeout: 15 * time.Minute,
		ErrorLog:     zap.NewStdLog(log),
	}
	return &Server{srv: srv, ln: ln, path: path}, nil
}

// Close releases the socket of a server that never served.
func (a *Server) Close() {
	a.ln.Close()
	_ = os.Remove(a.path)
}

// Serve serves until ctx is cancelled, then shuts down and removes the socket.
func (a *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- a.srv.Serve(a.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := a.srv.Shutdown(sctx)
	<-errc
	_ = os.Remove(a.path)
	return err
}

// Client talks to a running agent over its admin socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the agent's admin socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	defer c.hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("agent admin socket %s: %w (is the agent running?)", c.socket, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &apiError{Status: resp.StatusCode, Err: errors.New(e.Error)}
		}
		return &apiError{Status: resp.StatusCode, Err: errors.New(resp.Status)}
	}
	return json.Unmarshal(body, out)
}

// AgentAnswered reports whether err is the agent's own answer (its
// controls name their operation and cell), not a failure to reach it.
func AgentAnswered(err error) bool {
	var ae *apiError
	return errors.As(err, &ae)
}

// Status asks the agent for its status.
func (c *Client) Status(ctx context.Context) (supervisor.Status, error) {
	var st supervisor.Status
	err := c.do(ctx, http.MethodGet, "/v1/status", &st)
	return st, err
}

// Control drains, undrains or restarts a cell (verb is one of those).
func (c *Client) Control(ctx context.Context, verb, cell string) (supervisor.SlotStatus, error) {
	var st supervisor.SlotStatus
	err := c.do(ctx, http.MethodPost, "/v1/cells/"+cell+"/"+verb, &st)
	return st, err
}

// Shutdown asks the agent to stop every cell and end; it returns the
// agent's pid once the stop is under way.
func (c *Client) Shutdown(ctx context.Context) (int, error) {
	var a ShutdownAnswer
	err := c.do(ctx, http.MethodPost, "/v1/shutdown", &a)
	return a.PID, err
}

// UpgradeRuntime asks the agent to roll its cells onto the binary now at
// its configured path, or with dryRun what it would do.
func (c *Client) UpgradeRuntime(ctx context.Context, dryRun bool) (supervisor.UpgradePlan, error) {
	var plan supervisor.UpgradePlan
	path := "/v1/runtime/upgrade"
	if dryRun {
		path += "?dry_run=1"
	}
	err := c.do(ctx, http.MethodPost, path, &plan)
	return plan, err
}

// FetchStatus asks a running agent for its status over its admin socket.
func FetchStatus(ctx context.Context, socket string) (supervisor.Status, error) {
	return NewClient(socket).Status(ctx)
}
