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
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/egress"
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
}

// MaxIntakeInFlight bounds the forwards an intake reads and checks at
// once: each may hold a bundle of up to edgeapi.MaxBundleBytes in memory,
// and the agent runs in 128 MiB. Beyond it a forward is answered 503 at
// once, before its body is read, and its sender delivers it itself; a
// forward takes a fence's round trip, so honest peers rarely meet it.
const MaxIntakeInFlight = 16

// NewIntake serves s's intake.
func NewIntake(s *Sender) *Intake {
	return &Intake{s: s, log: s.log.Named("intake"), inFlight: make(chan struct{}, MaxIntakeInFlight)}
}

// Serve serves the intake on ln with the edges' mutual TLS until ctx
// ends, then shuts down (requests in flight get 5s).
func (in *Intake) Serve(ctx context.Context, ln net.Listener) error {
	if in.s.o.TLS == nil {
		return errors.New("intake: no edge TLS identity")
	}
	srv := &http.Server{
		Handler:           in,
		TLSConfig:         in.s.o.TLS.ServerConfig(),
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
	err := srv.ServeTLS(ln, "", "")
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
	peer, class, err := in.accept(r)
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

// accept decides on one forward; nil means journaled.
func (in *Intake) accept(r *http.Request) (peer, class string, _ error) {
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
	select {
	case in.inFlight <- struct{}{}:
		defer func() { <-in.inFlight }()
	default:
		return peer, class, refuse(http.StatusServiceUnavailable, "intake busy: %d forwards in flight", MaxIntakeInFlight)
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, edgeapi.MaxBundleBytes+1))
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
	rt, ok := in.s.holderRoute(class)
	if !ok {
		// The peer's election answer named this edge: ask again, this
		// edge may have been elected since it last asked.
		in.s.Reelect(class)
		return peer, class, refuse(http.StatusConflict, "this edge does not hold the %s lease", class)
	}
	ctx, cancel := context.WithTimeout(r.Context(), in.s.o.SendTimeout)
	defer cancel()
	err = in.s.o.Control.Fence(ctx, edgeapi.FenceRequest{Class: class, Epoch: rt.epoch, Peer: peer})
	var fe *controlclient.FenceError
	if errors.As(err, &fe) && (fe.Refusal.Reason == egress.FencePeerNotInOrg || fe.Refusal.Reason == egress.FencePeerNotEnrolled) {
		// The lease is this edge's, the peer is what the control API
		// refuses (deleted, of another org, its identity rotated away):
		// 403, which its sender does not answer with a direct send.
		return peer, class, refuse(http.StatusForbidden, "peer %s refused by the control API: %s", peer, fe.Refusal.Reason)
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
