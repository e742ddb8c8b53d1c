package agentmetrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"cellvisor/internal/backoff"
)

// Handler serves reg's metrics (one scrape at a time: each one calls every
// running cell).
func Handler(reg *prometheus.Registry, log *zap.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            zap.NewStdLog(log),
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 1,
		Timeout:             10 * time.Second,
	})
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
