package controlapi

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"cellvisor/controlapi/metrics"
	"cellvisor/internal/connlimit"
)

// ListenLimits bound a listener's connections (issue 32 §1): every one the
// replica holds costs it memory and a file descriptor whether or not its
// peer ever authenticates. Zero fields take the listener's defaults.
type ListenLimits struct {
	// MaxConns bounds the connections open at once.
	MaxConns int
	// MaxPending bounds those not yet established (not through the TLS
	// handshake, or through it without a client certificate: an
	// enrollment); at a cap the oldest of them is dropped for a new one.
	MaxPending int
	// MaxConnsPerIP bounds one source address's connections; zero means
	// none (edges may share NAT addresses).
	MaxConnsPerIP int
	// HandshakeTimeout closes a connection not through its TLS handshake.
	HandshakeTimeout time.Duration
}

// The edge-control listener's defaults. Open files first: the unit's
// LimitNOFILE=65536 less room for the database's connections, snapshot
// files, the admin listener and logs leaves 50,000 connections. Memory: an
// edge's established connection costs about 80 KiB (docs/control.md, the
// fleet load: 0.8 GiB for 10,000), so 50,000 is about 4 GiB, what a replica
// serving that many edges needs anyway. Pending connections are what an
// attacker without a certificate can hold: about 10 KiB each (5,000
// half-open ones cost 51 MB, issue 32), so 4,096 cap them at about 40 MiB
// whatever arrives; a 2-core replica completes some 1,000–2,000 full
// handshakes a second, so 4,096 pending is a reconnect storm's backlog of
// 2–4 s. 10 s for a handshake is what Serve's header timeout allowed before:
// a replica starved after a restart completes 10,000 reconnections in it.
const (
	DefaultEdgeMaxConns         = 50000
	DefaultEdgeMaxPending       = 4096
	DefaultEdgeHandshakeTimeout = 10 * time.Second
)

// The admin listener's: operators and Prometheus, a handful of
// connections; 256 × 80 KiB is 20 MiB. Any of them may be pending: an
// operator's script making a hundred calls at once opens a hundred
// connections that are pending until the server reads their requests,
// and a smaller cap dropped the oldest of them (CI saw it); a silent one
// still goes at the handshake deadline or at the cap.
const (
	adminMaxConns         = 256
	adminMaxPending       = adminMaxConns
	adminHandshakeTimeout = 10 * time.Second
)

// Validate checks the limits' bounds.
func (l ListenLimits) Validate() error {
	switch {
	case l.MaxConns < 0 || l.MaxConns > 1<<20:
		return fmt.Errorf("max connections must be 0 (default) to %d, got %d", 1<<20, l.MaxConns)
	case l.MaxPending < 0 || (l.MaxConns > 0 && l.MaxPending > l.MaxConns):
		return fmt.Errorf("max pending connections must be 0 (default) to the max connections, got %d", l.MaxPending)
	case l.MaxConnsPerIP < 0:
		return fmt.Errorf("max connections per address must be >= 0, got %d", l.MaxConnsPerIP)
	case l.HandshakeTimeout < 0 || l.HandshakeTimeout > time.Minute:
		return fmt.Errorf("handshake timeout must be 0 (default) to 1m, got %s", l.HandshakeTimeout)
	}
	return nil
}

func (l ListenLimits) orDefaults(maxConns, maxPending int, hs time.Duration) ListenLimits {
	if l.MaxConns == 0 {
		l.MaxConns = maxConns
	}
	if l.MaxPending == 0 {
		l.MaxPending = min(maxPending, l.MaxConns)
	}
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = hs
	}
	return l
}

// ListenEdge bounds ln's connections by lim and runs the edge-control TLS
// handshakes on them (EdgeTLSConfig, offering HTTP/2 and HTTP/1.1 as
// ServeTLS did): serve EdgeHandler on the listener with http.Server.Serve,
// with the returned TLS configuration as the server's TLSConfig and the
// listener's ConnState. Its counts are exported as
// cellvisor_control_listener_*{listener="edge"}.
func (s *Server) ListenEdge(ln net.Listener, lim ListenLimits) (*connlimit.Listener, *tls.Config, error) {
	if err := lim.Validate(); err != nil {
		return nil, nil, fmt.Errorf("edge-control listener: %w", err)
	}
	lim = lim.orDefaults(DefaultEdgeMaxConns, DefaultEdgeMaxPending, DefaultEdgeHandshakeTimeout)
	tc := s.EdgeTLSConfig()
	tc.NextProtos = []string{"h2", "http/1.1"}
	bl, err := connlimit.New(ln, connlimit.Options{Name: metrics.Edge, Max: lim.MaxConns, MaxPending: lim.MaxPending,
		MaxPerIP: lim.MaxConnsPerIP, HandshakeTimeout: lim.HandshakeTimeout, TLS: tc, Logger: s.log})
	if err != nil {
		return nil, nil, err
	}
	s.metrics.Listener(metrics.Edge, bl.Stats)
	return bl, tc, nil
}

// ListenAdmin bounds the admin listener's connections, with TLS (tc) or
// plain: a connection is established at its first request (serve it with
// the listener's ConnState; the admin API speaks HTTP/1.1 only).
func (s *Server) ListenAdmin(ln net.Listener, tc *tls.Config) (*connlimit.Listener, error) {
	o := connlimit.Options{Name: metrics.Admin, Max: adminMaxConns, MaxPending: adminMaxPending, HandshakeTimeout: adminHandshakeTimeout,
		Logger: s.log}
	if tc != nil {
		o.TLS = tc
		o.Established = func(tls.ConnectionState) bool { return false } // at its first request
	}
	bl, err := connlimit.New(ln, o)
	if err != nil {
		return nil, err
	}
	s.metrics.Listener(metrics.Admin, bl.Stats)
	return bl, nil
}
