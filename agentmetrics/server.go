package agentmetrics

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/backoff"
)

// scrapeTimeout bounds one scrape: a slower one is answered 503.
const scrapeTimeout = 10 * time.Second

// contentType is the text exposition format's.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

// Handler serves reg's metrics, one scrape at a time (each one calls every
// running cell): a scrape while another runs is answered 503 at once, and
// one that takes longer than scrapeTimeout 503 then.
func Handler(reg *Registry, log *zap.Logger) http.Handler {
	busy := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case busy <- struct{}{}:
			defer func() { <-busy }()
		default:
			http.Error(w, "another scrape is running; scrape less often", http.StatusServiceUnavailable)
			return
		}
		var buf bytes.Buffer
		if err := reg.Write(&buf); err != nil {
			log.Error("write metrics", zap.Error(err))
			http.Error(w, "metrics could not be written", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", contentType)
		if _, err := w.Write(buf.Bytes()); err != nil {
			log.Debug("send metrics", zap.Error(err))
		}
	})
	return http.TimeoutHandler(h, scrapeTimeout, "scrape timed out")
}

// Server serves /metrics on one address.
type Server struct {
	addr string
	h    http.Handler
	log  *zap.Logger

	mu    sync.Mutex // guards the following fields
	bound string     // the listener's address once bound
	err   error      // why the last bind failed
}

// NewServer returns a server of h on addr (IP:port).
func NewServer(addr string, h http.Handler, log *zap.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	return &Server{addr: addr, h: mux, log: log}
}

// Addr is the bound address ("" until bound) and the last bind error.
func (s *Server) Addr() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bound, s.err
}

// Run binds and serves until ctx ends. A bind that fails (the port held by
// another process) is logged and retried with backoff: metrics never keep
// the agent from supervising its cells.
func (s *Server) Run(ctx context.Context) {
	b := &backoff.Backoff{Initial: time.Second, Max: time.Minute}
	for {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", s.addr)
		if err == nil {
			s.serve(ctx, ln)
			return
		}
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		s.log.Error("metrics endpoint cannot listen; retrying", zap.String("listen", s.addr), zap.Error(err))
		if b.Wait(ctx) != nil {
			return
		}
	}
}

func (s *Server) serve(ctx context.Context, ln net.Listener) {
	s.mu.Lock()
	s.bound, s.err = ln.Addr().String(), nil
	s.mu.Unlock()
	s.log.Info("metrics endpoint listening", zap.String("url", "http://"+ln.Addr().String()+"/metrics"))
	srv := &http.Server{
		Handler:           s.h,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          zap.NewStdLog(s.log),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.log.Error("metrics endpoint stopped", zap.Error(err))
	}
	<-done
}
