package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/egress"
	"cellvisor/internal/connlimit"
)

// Intake is a lease holder's intake: peers of its org forward their
// bundles to it over mutual TLS. It accepts a bundle only while this edge
// holds the class's lease, checked with the control API for every bundle
// (a fence at this edge's epoch naming the peer, which must be a live edge
// of the org): no cached answer, so that a holder frozen past its lease
// refuses as soon as it runs again. An accepted bundle is journaled (202)
// and sent by this edge's sender, direct.
type Intake struct {
	s   *Sender
	log *zap.Logger
	// inFlight holds a token per forward being read or checked.
	inFlight chan struct{}
	// ln is the bounded listener once Serve runs.
	ln atomic.Pointer[connlimit.Listener]

	mu sync.Mutex // guards the following fields
	// peers counts each peer's forwards in flight (deleted at 0).
	peers map[string]int
	// foreign remembers peers the control API said are not live edges of
	// this org, until when and its reason: refused without asking again.
	foreign map[string]foreignPeer
}

type foreignPeer struct {
	until  time.Time
	reason string // the fence's: peer_not_in_org, peer_not_live
}

// foreignFor is how long a peer the control API refused as not of this
// org (or not live) is refused without asking again: another org's edge
// retrying in a loop costs a control-API call per minute, not one per
// request. An edge of the org that was not live yet (just enrolled) is
// accepted again after it.
const foreignFor = time.Minute

// IntakeLimits bound the intake's connections: each one the agent holds
// costs it memory whether or not its peer ever authenticates, and the
// agent runs in 128 MiB (issue 32 §1: about 12,000 half-open connections
// killed it). Zero fields take the defaults below.
type IntakeLimits struct {
	// MaxConns bounds the connections open at once; half of them at most
	// may be pending (not through their mutual-TLS handshake). At the cap
	// the oldest pending connection is dropped for a new one; a new one is
	// refused only when every connection is an authenticated peer's.
	MaxConns int
	// MaxConnsPerIP bounds one source address's connections.
	MaxConnsPerIP int
	// HandshakeTimeout closes a connection not through its handshake.
	HandshakeTimeout time.Duration
}

// The intake's connection defaults, from the memory it may use: 8 MiB of
// the agent's 128 MiB for its connections (the bundles being read are
// bounded apart, MaxIntakeInFlight × 1 MiB). An established mutual-TLS
// connection costs at most about 64 KiB (a goroutine's stack, TLS record
// buffers of up to 16 KiB each way, the HTTP reader's and writer's 4 KiB),
// a pending one far less (measured: docs/egress.md), so 8 MiB / 64 KiB =
// 128 connections, 64 of them pending. A peer uses at most one connection
// per class in flight plus two idle ones (its forward client's
// MaxIdleConnsPerHost), about 4: 16 per address lets four edges share a
// NAT address. The handshake is one or two round trips between edges: 3 s
// covers the slowest intercontinental path several times over.
const (
	DefaultIntakeMaxConns         = 128
	DefaultIntakeMaxConnsPerIP    = 16
	DefaultIntakeHandshakeTimeout = 3 * time.Second
)

// withDefaults fills the zero fields.
func (l IntakeLimits) withDefaults() IntakeLimits {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultIntakeMaxConns
	}
	if l.MaxConnsPerIP <= 0 {
		l.MaxConnsPerIP = DefaultIntakeMaxConnsPerIP
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultIntakeHandshakeTimeout
	}
	return l
}

// MaxIntakeInFlight bounds the forwards an intake reads and checks at
// once: each may hold a bundle of up to edgeapi.MaxBundleBytes in memory,
// and the agent runs in 128 MiB. Beyond it a forward is answered 503 at
// once, before its body is read, and its sender delivers it itself; a
// forward takes a fence's round trip, so honest peers rarely meet it.
const MaxIntakeInFlight = 16

// NewIntake serves s's intake.
func NewIntake(s *Sender) *Intake {
	return &Intake{s: s, log: s.log.Named("intake"), inFlight: make(chan struct{}, MaxIntakeInFlight),
		peers: map[string]int{}, foreign: map[string]foreignPeer{}}
}

// ConnStats are the intake listener's connection counts (zero before
// Serve).
func (in *Intake) ConnStats() connlimit.Stats {
	if ln := in.ln.Load(); ln != nil {
		return ln.Stats()
	}
	return connlimit.Stats{}
}

// Serve serves the intake on ln with the edges' mutual TLS until ctx
// ends, then shuts down (requests in flight get 5s). ln's connections are
// bounded by the sender's IntakeLimits; the TLS handshakes run under them.
func (in *Intake) Serve(ctx context.Context, ln net.Listener) error {
	if in.s.o.TLS == nil {
		return errors.New("intake: no edge TLS identity")
	}
	lim := in.s.o.IntakeConns.withDefaults()
	tc := in.s.o.TLS.ServerConfig()
	tc.NextProtos = []string{"http/1.1"} // forwarders speak HTTP/1.1
	bl, err := connlimit.New(ln, connlimit.Options{Name: "intake", Max: lim.MaxConns, MaxPending: lim.MaxConns / 2,
		MaxPerIP: lim.MaxConnsPerIP, HandshakeTimeout: lim.HandshakeTimeout, TLS: tc, Logger: in.log})
	if err != nil {
		return fmt.Errorf("intake: %w", err)
	}
	in.ln.Store(bl)
	srv := &http.Server{
		Handler:           in,
		TLSConfig:         tc,
		ConnState:         bl.ConnState,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          zap.NewStdLog(in.log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err = srv.Serve(bl)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// refusal is an intake's answer that is not 202.
type refusal struct {
	code   int
	reason string
	holder *edgeapi.Holder
}

func (r *refusal) Error() string { return r.reason }

func refuse(code int, format string, args ...any) *refusal {
	return &refusal{code: code, reason: fmt.Sprintf(format, args...)}
}

func (in *Intake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer, class, err := in.accept(w, r)
	var rf *refusal
	switch {
	case err == nil:
		in.s.intake.count(http.StatusAccepted)
		w.WriteHeader(http.StatusAccepted)
		return
	case errors.As(err, &rf):
	default:
		rf = &refusal{code: http.StatusInternalServerError, reason: err.Error()}
	}
	in.s.intake.count(rf.code)
	in.log.Warn("forward refused", zap.String("peer", peer), zap.String("class", class), zap.Int("status", rf.code), zap.String("reason", rf.reason))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rf.code)
	json.NewEncoder(w).Encode(edgeapi.FenceRefusal{Reason: rf.reason, Holder: rf.holder})
}

// accept decides on one forward; nil means journaled. What costs the
// intake nothing comes first; then the peer's share (one forward per
// routed class in flight: its sender has no more), then the control API's
// word that this edge holds the lease and that the peer is a live edge of
// its org (the fence), and only then a slot and the body, read within the
// send timeout: another org's edge never holds a slot, and a peer of the
// org at most its share, for a bounded time (issue 32 §2).
func (in *Intake) accept(w http.ResponseWriter, r *http.Request) (peer, class string, _ error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return "", "", refuse(http.StatusUnauthorized, "no verified client certificate")
	}
	peer = r.TLS.VerifiedChains[0][0].Subject.CommonName
	class, ok := strings.CutPrefix(r.URL.Path, edgeapi.PathIntake)
	if !ok || !in.s.Routes(class) {
		return peer, class, refuse(http.StatusNotFound, "no intake for class %q here", class)
	}
	if r.Method != http.MethodPost {
		return peer, class, refuse(http.StatusMethodNotAllowed, "POST a bundle")
	}
	if fp, ok := in.foreignPeer(peer); ok {
		return peer, class, refuse(peerRefusalStatus(fp.reason), "edge %s refused: %s, as the control API answered (asked again after %s)",
			peer, fp.reason, fp.until.Format(time.RFC3339))
	}
	release, ok := in.takePeer(peer)
	if !ok {
		return peer, class, refuse(http.StatusTooManyRequests, "edge %s has %d forwards in flight here, its share", peer, in.perPeer())
	}
	defer release()
	rt, ok := in.s.holderRoute(class)
	if !ok {
		// The peer's election answer named this edge: ask again, this
		// edge may have been elected since it last asked.
		in.s.Reelect(class)
		return peer, class, refuse(http.StatusConflict, "this edge does not hold the %s lease", class)
	}
	ctx, cancel := context.WithTimeout(r.Context(), in.s.o.SendTimeout)
	defer cancel()
	err := in.s.o.Control.Fence(ctx, edgeapi.FenceRequest{Class: class, Epoch: rt.epoch, Peer: peer})
	var fe *controlclient.FenceError
	if errors.As(err, &fe) && (fe.Refusal.Reason == egress.FencePeerNotInOrg || fe.Refusal.Reason == egress.FencePeerNotEnrolled || fe.Refusal.Reason == egress.FencePeerNotLive) {
		in.markForeign(peer, fe.Refusal.Reason)
		return peer, class, refuse(peerRefusalStatus(fe.Refusal.Reason), "edge %s refused: %v", peer, err)
	}
	if identityRefused(err) {
		in.s.refusedIdentity(class, err)
	}
	if errors.Is(err, ErrStale) {
		in.s.Wake(class) // its own sends will find the lease stale and elect
		return peer, class, refuse(http.StatusConflict, "lease not current at epoch %d or peer refused: %v", rt.epoch, err)
	}
	if err != nil {
		return peer, class, refuse(http.StatusServiceUnavailable, "cannot check the lease: %v", err)
	}
	select {
	case in.inFlight <- struct{}{}:
		defer func() { <-in.inFlight }()
	default:
		return peer, class, refuse(http.StatusServiceUnavailable, "intake busy: %d forwards in flight", MaxIntakeInFlight)
	}
	// The sender gives up after its send timeout: a body still coming
	// then is cut, not waited on for the server's 30s read timeout. (A
	// deadline is the network stack's, in real time: not the Sender's clock.)
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(in.s.o.SendTimeout)); err != nil {
		return peer, class, fmt.Errorf("bound the body's read: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, edgeapi.MaxBundleBytes+1))
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		return peer, class, refuse(http.StatusRequestTimeout, "bundle not read within %s", in.s.o.SendTimeout)
	}
	if err != nil {
		return peer, class, refuse(http.StatusBadRequest, "read bundle: %v", err)
	}
	if len(data) > edgeapi.MaxBundleBytes {
		return peer, class, refuse(http.StatusRequestEntityTooLarge, "bundle over %d bytes", edgeapi.MaxBundleBytes)
	}
	var b edgeapi.Bundle
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return peer, class, refuse(http.StatusBadRequest, "decode bundle: %v", err)
	}
	if err := Validate(b); err != nil {
		return peer, class, refuse(http.StatusBadRequest, "%v", err)
	}
	switch {
	case b.Class != class:
		return peer, class, refuse(http.StatusBadRequest, "bundle %s is of class %q, posted to %q", b.ID, b.Class, class)
	case b.Org != in.s.o.Org:
		return peer, class, refuse(http.StatusConflict, "bundle %s is of org %q, this intake serves %q", b.ID, b.Org, in.s.o.Org)
	case b.Origin != peer:
		return peer, class, refuse(http.StatusConflict, "bundle %s originates at %q, forwarded by %q: a peer forwards only its own", b.ID, b.Origin, peer)
	}
	if err := in.s.o.Journal.Put(b); err != nil {
		if errors.Is(err, ErrJournalFull) {
			return peer, class, refuse(http.StatusInsufficientStorage, "%v", err)
		}
		return peer, class, err
	}
	in.log.Debug("forward journaled", zap.String("peer", peer), zap.String("class", class), zap.String("bundle", b.ID), zap.Int64("epoch", rt.epoch))
	in.s.Wake(class)
	return peer, class, nil
}

// perPeer is a peer's share of the intake: one forward per routed class
// in flight, as its sender has at most (one loop per class).
// peerRefusalStatus is the answer to a peer the control API refused: 403
// where it refuses the peer itself (deleted, of another org, its identity
// rotated away), which its sender never answers with a direct send; 409
// where it has not seen the peer lately (not live), which goes direct.
func peerRefusalStatus(reason string) int {
	if reason == egress.FencePeerNotInOrg || reason == egress.FencePeerNotEnrolled {
		return http.StatusForbidden
	}
	return http.StatusConflict
}

func (in *Intake) perPeer() int { return max(1, len(in.s.o.Classes)) }

// takePeer takes one of peer's forwards in flight, or reports it holds
// its share; release gives it back.
func (in *Intake) takePeer(peer string) (release func(), ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.peers[peer] >= in.perPeer() {
		return nil, false
	}
	in.peers[peer]++
	return func() {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.peers[peer]--; in.peers[peer] <= 0 {
			delete(in.peers, peer)
		}
	}, true
}

// peerInFlight is peer's forwards in flight.
func (in *Intake) peerInFlight(peer string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.peers[peer]
}

// foreignPeer reports whether peer is refused as not a live edge of this
// org, until when and why.
func (in *Intake) foreignPeer(peer string) (foreignPeer, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	fp, ok := in.foreign[peer]
	if ok && !in.s.clk.Now().Before(fp.until) {
		delete(in.foreign, peer)
		return foreignPeer{}, false
	}
	return fp, ok
}

// maxForeign bounds the peers remembered as foreign: past it the expired
// ones are forgotten, and if none is, the oldest.
const maxForeign = 1024

func (in *Intake) markForeign(peer, reason string) {
	now := in.s.clk.Now()
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.foreign) >= maxForeign {
		var oldest string
		for p, fp := range in.foreign {
			if !now.Before(fp.until) {
				delete(in.foreign, p)
			} else if oldest == "" || fp.until.Before(in.foreign[oldest].until) {
				oldest = p
			}
		}
		if len(in.foreign) >= maxForeign {
			delete(in.foreign, oldest)
		}
	}
	in.foreign[peer] = foreignPeer{until: now.Add(foreignFor), reason: reason}
}
