package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"go.uber.org/zap"
)

// AdminServer serves the agent's status on a local unix socket (mode 0600).
type AdminServer struct {
	srv  *http.Server
	ln   net.Listener
	path string
}

// ListenAdmin binds the admin socket, replacing a stale one.
func ListenAdmin(path string, status func() Status, log *zap.Logger) (*AdminServer, error) {
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
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(status()); err != nil {
			log.Warn("write status", zap.Error(err))
		}
	})
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		ErrorLog:          zap.NewStdLog(log),
	}
	return &AdminServer{srv: srv, ln: ln, path: path}, nil
}

// Close releases the socket of a server that never served.
func (a *AdminServer) Close() {
	a.ln.Close()
	_ = os.Remove(a.path)
}

// Serve serves until ctx is cancelled, then shuts down and removes the socket.
func (a *AdminServer) Serve(ctx context.Context) error {
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

// FetchStatus asks a running agent for its status over its admin socket.
func FetchStatus(ctx context.Context, socket string) (Status, error) {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/v1/status", nil)
	if err != nil {
		return Status{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Status{}, fmt.Errorf("agent admin socket %s: %w (is the agent running?)", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Status{}, fmt.Errorf("agent status: %s", resp.Status)
	}
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return Status{}, fmt.Errorf("decode agent status: %w", err)
	}
	return st, nil
}
