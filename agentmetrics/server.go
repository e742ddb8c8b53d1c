package agentmetrics

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/backoff"
	"cellvisor/internal/connlimit"
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

// The endpoint's connection defaults, from the memory it may use: 1 MiB of
// the agent's 128 MiB. A connection costs at most about 64 KiB (a
// goroutine, the HTTP reader's and writer's buffers, a scrape's response
// being written), so 1 MiB / 64 KiB = 16, half of them at most without a
// first request; a Prometheus server keeps one connection per target. A
// scraper sends its request as soon as it connects: 3 s is ample.
const (
	DefaultMaxConns         = 16
	DefaultHandshakeTimeout = 3 * time.Second
)

// Limits bound the endpoint's connections; zero fields take the defaults.
type Limits struct {
	// MaxConns bounds the connections open at once, half of them at most
	// without a first request: at the cap the oldest of those is dropped
	// for a new one. No cap per address: scrapers are few, and on
	// loopback every one is 127.0.0.1.
	MaxConns int
	// HandshakeTimeout closes a connection whose first request's headers
	// have not come within it.
	HandshakeTimeout time.Duration
}

// Server serves /metrics on one address.
type Server struct {
	addr string
	h    http.Handler
	lim  Limits
	log  *zap.Logger
	ln   atomic.Pointer[connlimit.Listener] // once bound

	mu    sync.Mutex // guards the following fields
	bound string     // the listener's address once bound
	err   error      // why the last bind failed
}

// NewServer returns a server of h on addr (IP:port), its connections
// bounded by lim.
func NewServer(addr string, h http.Handler, lim Limits, log *zap.Logger) *Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	if lim.MaxConns <= 0 {
		lim.MaxConns = DefaultMaxConns
	}
	if lim.HandshakeTimeout <= 0 {
		lim.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return &Server{addr: addr, h: mux, lim: lim, log: log}
}

// ConnStats are the endpoint's connection counts (zero until bound).
func (s *Server) ConnStats() connlimit.Stats {
	if ln := s.ln.Load(); ln != nil {
		return ln.Stats()
	}
	return connlimit.Stats{}
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

func (s *Server) serve(ctx context.Context, inner net.Listener) {
	ln, err := connlimit.New(inner, connlimit.Options{Name: "metrics", Max: s.lim.MaxConns, MaxPending: max(1, s.lim.MaxConns/2),
		HandshakeTimeout: s.lim.HandshakeTimeout, Logger: s.log})
	if err != nil {
		inner.Close()
		s.log.Error("metrics endpoint", zap.Error(err))
		return
	}
	s.ln.Store(ln)
	s.mu.Lock()
	s.bound, s.err = ln.Addr().String(), nil
	s.mu.Unlock()
	s.log.Info("metrics endpoint listening", zap.String("url", "http://"+ln.Addr().String()+"/metrics"))
	srv := &http.Server{
		Handler:           s.h,
		ConnState:         ln.ConnState,
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
