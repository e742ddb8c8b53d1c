package controlapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/metrics"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

// EdgeHandler serves the edge-control API. Serve it on ListenEdge's listener.
func (s *Server) EdgeHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+edgeapi.PathEnroll, s.admit(class(ClassEnroll), s.handle(s.enroll)))
	mux.HandleFunc("POST "+edgeapi.PathRenew, s.admit(class(ClassRenew), s.edge(s.renew)))
	mux.HandleFunc("GET "+edgeapi.PathManifest, s.admit(pollClass, s.edge(s.manifest)))
	mux.HandleFunc("GET "+edgeapi.PathArtifacts+"{sha}", s.admit(class(ClassFetch), s.edge(s.artifact)))
	mux.HandleFunc("GET "+edgeapi.PathSnapshot, s.admit(class(ClassFetch), s.edge(s.snapshot)))
	mux.HandleFunc("POST "+edgeapi.PathAcks, s.admit(class(ClassAck), s.edge(s.ack)))
	mux.HandleFunc("POST "+edgeapi.PathStatus, s.admit(class(ClassStatus), s.edge(s.status)))
	mux.HandleFunc("PUT "+edgeapi.PathEncryptionKey, s.admit(class(ClassRenew), s.edge(s.putEncryptionKey)))
	mux.HandleFunc("GET "+edgeapi.PathTasks, s.admit(class(ClassTasks), s.edge(s.tasks)))
	mux.HandleFunc("POST "+edgeapi.PathTasks+"{id}/ack", s.admit(class(ClassAck), s.edge(s.taskAck)))
	mux.HandleFunc("POST "+edgeapi.PathEgressElect, s.admit(class(ClassElect), s.edge(s.limited(ClassElect, newEdgeLimiter(electBurst, electRate), s.elect))))
	mux.HandleFunc("POST "+edgeapi.PathEgressFence, s.admit(class(ClassElect), s.edge(s.fence)))
	mux.HandleFunc("GET "+edgeapi.PathFrontDoors, s.admit(class(ClassFetch), s.edge(s.edgeFrontDoors)))
	return s.instrument(metrics.Edge, mux, mux)
}

// edgeFunc is a handler for an authenticated edge. Its state's sequence is
// the database's for every request but the cheap poll.
type edgeFunc func(w http.ResponseWriter, r *http.Request, edge store.EdgeState) error

// edge authenticates the client certificate: verified against the CA by
// the TLS layer, and the edge's current one (a rotated identity's
// certificate is refused here), or its renewed one, pending, which this
// first use makes current.
func (s *Server) edge(h edgeFunc) http.HandlerFunc {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			return errorf(http.StatusUnauthorized, "a client certificate issued at enrollment is required")
		}
		leaf := r.TLS.VerifiedChains[0][0]
		id := leaf.Subject.CommonName
		serial := pki.SerialHex(leaf)
		st, ok := s.cache.current(r.Context(), id, serial)
		if ok && !s.cheapPoll(r, st) {
			// Anything with a body: the database's word on the certificate,
			// not the cache's (a rotation on another replica a moment ago).
			e, err := s.st.Edge(r.Context(), id)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			ok = err == nil && e.CertSerial == serial
			st.Sequence = e.Sequence // and on the sequence: handlers use it
		}
		if !ok {
			var err error
			if st, ok, err = s.promote(r.Context(), id, serial); err != nil {
				return err
			}
		}
		if !ok {
			s.log.Warn("security: refused a client certificate that is not the edge's current identity",
				zap.String("edge", id), zap.String("serial", pki.SerialHex(leaf)), zap.String("remote", r.RemoteAddr))
			return errorf(http.StatusUnauthorized, "client certificate is not edge %s's current identity (rotated or unknown)", id)
		}
		s.cache.see(id, s.o.Now())
		return h(w, r, st)
	})
}

// cheapPoll reports a manifest poll the cache answers with 304: it gives
// nothing away, so a cached view of the certificate (at most one refresh
// interval old) is enough for it. A poll with a fan-out to build is not.
func (s *Server) cheapPoll(r *http.Request, st store.EdgeState) bool {
	if r.URL.Path != edgeapi.PathManifest {
		return false
	}
	q := r.URL.Query()
	after, err := strconv.ParseInt(q.Get("after"), 10, 64)
	return err == nil && q.Get("cursor") == "" && st.Sequence <= after && !s.cache.unbuilt(st)
}

// build brings the edge's manifest up to every fan-out that concerns it
// (store.Build), when one does, and returns its state with the newest
// sequence.
func (s *Server) build(ctx context.Context, st store.EdgeState) (store.EdgeState, error) {
	if !s.cache.unbuilt(st) {
		return st, nil
	}
	start := time.Now()
	b, err := s.st.Build(ctx, st.ID, s.sign)
	if err != nil {
		return st, err
	}
	s.metrics.Build(time.Since(start), b.Advanced)
	s.cache.built(st.ID, b)
	st.Sequence, st.Built, st.Gen = b.Sequence, b.Gen, b.Gen
	return st, nil
}

// enroll exchanges a bootstrap token and a CSR for a client certificate.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request) error {
	outcome := "failed"
	defer func() { s.metrics.Enrollment(outcome) }()
	var req edgeapi.EnrollRequest
	if err := decode(r, edgeapi.MaxEnrollBytes, &req); err != nil {
		outcome = "invalid"
		return err
	}
	csr, err := pki.ParseCSR(req.CSR)
	if err != nil {
		outcome = "invalid"
		return errorf(http.StatusBadRequest, "%v", err)
	}
	tokenHash := hashToken(req.Token)
	e, err := s.st.EdgeByToken(r.Context(), tokenHash)
	if errors.Is(err, store.ErrNotFound) || req.Token == "" {
		outcome = "unknown_token"
		s.log.Warn("security: enrollment with an unknown, used-up or rotated-away token", zap.String("remote", r.RemoteAddr))
		return errorf(http.StatusUnauthorized, "unknown bootstrap token (never issued, or replaced by an identity rotation)")
	}
	if err != nil {
		return err
	}
	if req.EncryptionKey != "" {
		if _, err := tlsseal.DecodePublic(req.EncryptionKey); err != nil {
			outcome = "invalid"
			return errorf(http.StatusBadRequest, "%v", err)
		}
	}
	// The encryption key is part of an exact retry, as the CSR is.
	csrHash := enrollHash(csr, req.EncryptionKey)
	now := s.o.Now()
	switch {
	case e.CSRHash == csrHash:
		outcome = "retried"
		return s.enrollRetry(w, r, e, csr, req.EncryptionKey, now)
	case e.CSRHash != "":
		outcome = "token_used"
		s.log.Warn("security: a different CSR for a consumed bootstrap token", zap.String("edge", e.ID), zap.String("remote", r.RemoteAddr))
		return errTokenUsed
	case !e.TokenExpiresAt.IsZero() && !now.Before(e.TokenExpiresAt):
		outcome = "token_expired"
		s.log.Warn("security: enrollment with an expired bootstrap token", zap.String("edge", e.ID),
			zap.Time("expired", e.TokenExpiresAt), zap.String("remote", r.RemoteAddr))
		return errorf(http.StatusUnauthorized, "bootstrap token expired at %s; rotate the edge for a new one", e.TokenExpiresAt.UTC().Format(time.RFC3339))
	}
	cert, certPEM, err := s.ca.IssueClientFor(csr, e.ID, now, s.o.ClientCertTTL)
	if err != nil {
		return err
	}
	if err := s.st.Enroll(r.Context(), e.ID, tokenHash, csrHash, certPEM, pki.SerialHex(cert)); err != nil {
		if errors.Is(err, store.ErrConflict) {
			// Another request consumed the token first: the retry rules apply.
			outcome = "raced"
			return s.enrollRaced(w, r, tokenHash, csr, req.EncryptionKey)
		}
		return err
	}
	if err := s.registerEncryptionKey(r.Context(), e.ID, req.EncryptionKey); err != nil {
		return err
	}
	outcome = "enrolled"
	s.refresh(r.Context())
	s.log.Info("edge enrolled", zap.String("edge", e.ID), zap.String("name", e.Name), zap.String("serial", pki.SerialHex(cert)))
	return s.writeEnrolled(w, e.ID, e.Org, certPEM, e.Slots)
}

func (s *Server) enrollRaced(w http.ResponseWriter, r *http.Request, tokenHash string, csr *x509.CertificateRequest, enc string) error {
	e, err := s.st.EdgeByToken(r.Context(), tokenHash)
	if err != nil {
		return errorf(http.StatusUnauthorized, "unknown bootstrap token")
	}
	if e.CSRHash == enrollHash(csr, enc) {
		return s.enrollRetry(w, r, e, csr, enc, s.o.Now())
	}
	return errTokenUsed
}

var errTokenUsed = errorf(http.StatusConflict, "bootstrap token already used with another key; rotate the edge's identity for a new token")

func (s *Server) writeEnrolled(w http.ResponseWriter, id, org, certPEM string, slots int) error {
	writeJSON(w, http.StatusOK, edgeapi.EnrollResponse{
		EdgeID: id, Org: org, Certificate: certPEM, CA: s.ca.PEM, ControlPublicKey: s.PublicKey(), Slots: slots,
	})
	return nil
}

// refresh brings the cache up to this replica's own writes at once.
func (s *Server) refresh(ctx context.Context) {
	if err := s.cache.refresh(ctx); err != nil {
		s.log.Warn("refresh edge cache", zap.Error(err))
	}
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// etag is a manifest sequence as an entity tag.
func etag(seq int64) string { return `"` + strconv.FormatInt(seq, 10) + `"` }

// manifest serves one page of the edge's newest manifest after ?after=,
// or 304 with no body when there is none: answered from the cache alone.
func (s *Server) manifest(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	q := r.URL.Query()
	after, err := strconv.ParseInt(q.Get("after"), 10, 64)
	if err != nil || after < 0 || after > manifest.MaxSequence {
		return errorf(http.StatusBadRequest, "after: want a sequence 0–%d", int64(manifest.MaxSequence))
	}
	cursor := q.Get("cursor")
	wait, err := waitParam(q.Get(edgeapi.QueryWait))
	if err != nil {
		return err
	}
	if cursor == "" {
		if st, err = s.build(r.Context(), st); err != nil {
			return err
		}
		if st.Sequence <= after && st.PendingTasks == 0 && wait > 0 && r.Header.Get("If-None-Match") != "" {
			start := time.Now()
			unheld(r) // a hold is a wait, not work: its class's slot is free meanwhile
			st, err = s.hold(r, st, after, wait)
			heldFor(w, time.Since(start))
			if err != nil {
				return err
			}
			if st.Sequence > after && !s.reheld(w, r) {
				return nil // a page to build and send: work again, admitted again
			}
		}
	}
	w.Header().Set(edgeapi.HeaderTasks, strconv.Itoa(st.PendingTasks))
	w.Header().Set(edgeapi.HeaderStatusInterval, strconv.Itoa(int(s.o.StatusInterval/time.Second)))
	if cursor == "" && st.Sequence <= after {
		w.Header().Set("ETag", etag(after))
		if r.Header.Get("If-None-Match") != "" {
			w.WriteHeader(http.StatusNotModified)
		} else {
			w.WriteHeader(http.StatusNoContent)
		}
		s.metrics.Poll(metrics.PollNotModified)
		return nil
	}
	seq, from := st.Sequence, ""
	if cursor != "" {
		c, d, ok := strings.Cut(cursor, ":")
		n, err := strconv.ParseInt(c, 10, 64)
		if !ok || err != nil || n <= after || n > manifest.MaxSequence {
			return errorf(http.StatusBadRequest, "cursor %q is not one this API gave", cursor)
		}
		seq, from = n, d
	}
	entries, err := s.st.Entries(r.Context(), st.ID, seq, from, manifest.MaxEntries+1)
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusGone, "manifest sequence %d is no longer served; start again from the first page", seq)
	}
	if err != nil {
		return err
	}
	h, sig, assign, err := s.st.HeaderAssignments(r.Context(), st.ID, seq)
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusGone, "manifest sequence %d is no longer served; start again from the first page", seq)
	}
	if err != nil {
		return err
	}
	p := manifest.Page{EdgeID: st.ID, Sequence: seq, Entries: entries, Header: h, HeaderSignature: sig, Assignments: assign}
	if len(entries) > manifest.MaxEntries {
		p.Entries = entries[:manifest.MaxEntries]
		p.Next = fmt.Sprintf("%d:%s", seq, p.Entries[len(p.Entries)-1].Domain)
	}
	if p.Entries == nil {
		p.Entries = []manifest.Entry{}
	}
	w.Header().Set("ETag", etag(seq))
	writeJSON(w, http.StatusOK, p)
	s.metrics.Poll(metrics.PollManifest)
	return nil
}

// waitParam parses ?wait= (seconds; empty for none), capped at
// edgeapi.MaxWait.
func waitParam(v string) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errorf(http.StatusBadRequest, "wait: want seconds, 0–%d", int(edgeapi.MaxWait.Seconds()))
	}
	return min(time.Duration(n)*time.Second, edgeapi.MaxWait), nil
}

// hold holds a poll with nothing new until the edge's manifest moves past
// after, a task is pending for it, or wait (less up to a tenth, at random,
// so that held polls do not come back together) is over; then it returns
// the edge's state, its manifest built. A change to show re-checks the
// certificate against the database, as anything with a body does.
func (s *Server) hold(r *http.Request, st store.EdgeState, after int64, wait time.Duration) (store.EdgeState, error) {
	ctx := r.Context()
	serial := pki.SerialHex(r.TLS.VerifiedChains[0][0]) // edge() checked there is one
	t := time.NewTimer(wait - rand.N(wait/10+1))
	defer t.Stop()
	defer func() { s.cache.see(st.ID, s.o.Now()) }() // the poll is the heartbeat
	s.cache.holding(st.ID, 1)                        // seen while held (Run)
	defer s.cache.holding(st.ID, -1)
	s.metrics.Held(1)
	defer s.metrics.Held(-1)
	for {
		ch := s.cache.watch(st.ID)
		cur, ok := s.cache.get(st.ID)
		if !ok || cur.CertSerial != serial {
			return st, errorf(http.StatusUnauthorized, "client certificate is not edge %s's current identity (rotated or unknown)", st.ID)
		}
		if cur.Sequence > after || cur.PendingTasks > 0 || s.cache.unbuilt(cur) {
			break
		}
		select {
		case <-ch:
			continue
		case <-t.C:
		case <-s.holds:
		case <-ctx.Done():
			return st, ctx.Err()
		}
		return cur, nil
	}
	e, err := s.st.Edge(ctx, st.ID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && e.CertSerial != serial) {
		return st, errorf(http.StatusUnauthorized, "client certificate is not edge %s's current identity (rotated or unknown)", st.ID)
	}
	if err != nil {
		return st, err
	}
	cur, _ := s.cache.get(st.ID)
	cur.Sequence = max(cur.Sequence, e.Sequence)
	return s.build(ctx, cur)
}

// artifact serves an artifact named in one of the edge's manifests.
func (s *Server) artifact(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	data, err := s.st.Artifact(r.Context(), st.ID, r.PathValue("sha"))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Write(data)
	return nil
}

// ack records an acknowledgement.
func (s *Server) ack(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var a manifest.Ack
	if err := decode(r, edgeapi.MaxAckBytes, &a); err != nil {
		s.metrics.Ack("invalid")
		return err
	}
	if a.Sequence == 0 && a.Status == manifest.AckRefused {
		s.metrics.Ack(manifest.AckRefused)
		// A refusal of something that had no sequence (a recovery snapshot
		// that could not be read): logged, nothing to record.
		s.log.Warn("ack", zap.String("edge", st.ID), zap.String("status", a.Status), zap.String("reason", a.Reason))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	switch {
	case a.Sequence < 1 || a.Sequence > manifest.MaxSequence:
		s.metrics.Ack("invalid")
		return errorf(http.StatusBadRequest, "sequence: want 1–%d", int64(manifest.MaxSequence))
	case a.Status != manifest.AckApplied && a.Status != manifest.AckRefused && a.Status != manifest.AckPartial:
		s.metrics.Ack("invalid")
		return errorf(http.StatusBadRequest, "status %q: want applied, refused or partial", a.Status)
	}
	if err := validRuntimes(a.Runtimes); err != nil {
		s.metrics.Ack("invalid")
		return errorf(http.StatusBadRequest, "%v", err)
	}
	if err := s.writer.Ack(r.Context(), st.ID, a); err != nil { // answered once committed
		return err
	}
	s.metrics.Ack(a.Status)
	log := s.log.Info
	if a.Status != manifest.AckApplied {
		log = s.log.Warn
	}
	s.nudgeMoves()
	log("ack", zap.String("edge", st.ID), zap.Int64("sequence", a.Sequence), zap.String("status", a.Status), zap.String("reason", a.Reason))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// status records the agent's status report.
func (s *Server) status(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var rep edgeapi.StatusReport
	if err := decode(r, edgeapi.MaxStatusBytes, &rep); err != nil {
		return err
	}
	var sum edgeapi.Summary
	if len(rep.Status) == 0 || json.Unmarshal(rep.Status, &sum) != nil {
		return errorf(http.StatusBadRequest, "status: want the agent's status object")
	}
	if err := validGateways(rep.Gateways); err != nil {
		return err
	}
	digest, err := statusDigest(rep.Status, sum, rep.Gateways)
	if err != nil {
		return errorf(http.StatusBadRequest, "status: %v", err)
	}
	now := s.o.Now()
	if s.cache.statusUnchanged(st.ID, digest, now, s.o.StatusRewrite) {
		// Nothing the control plane reads changed: last seen is the cache's
		// (edge() saw it), and the stored report and gateway rows stay.
		s.metrics.Status(metrics.StatusUnchanged)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	// One transaction for the whole report: the status object, its egress
	// part (cleared when absent) and its gateways (left when absent).
	rec := store.Report{Status: rep.Status, At: rep.At}
	rec.IntakeURL, rec.Reach = s.egressReport(st.ID, sum.Egress, rep.At)
	if rep.Gateways != nil {
		rec.Gateways, rec.GatewaysAt, rec.SyncGateways = gatewayRows(rep.Gateways), now, true
	}
	if err := s.writer.PutStatus(r.Context(), st.ID, rec); err != nil { // answered once committed
		s.cache.wroteStatus(st.ID, digest, now, true)
		return err
	}
	s.cache.wroteStatus(st.ID, digest, now, false)
	s.metrics.Status(metrics.StatusWritten)
	s.nudgeMoves()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// tasks lists the edge's pending tasks.
func (s *Server) tasks(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	ts, err := s.st.Tasks(r.Context(), st.ID, true, 100)
	if err != nil {
		return err
	}
	out := []edgeapi.Task{}
	for _, t := range ts {
		out = append(out, edgeapi.Task{ID: t.ID, Cell: t.Cell, Action: t.Action, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// taskAck records what became of a task.
func (s *Server) taskAck(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return errorf(http.StatusBadRequest, "task id %q", r.PathValue("id"))
	}
	var a edgeapi.TaskAck
	if err := decode(r, edgeapi.MaxAckBytes, &a); err != nil {
		return err
	}
	if a.State != edgeapi.TaskDone && a.State != edgeapi.TaskFailed {
		return errorf(http.StatusBadRequest, "state %q: want done or failed", a.State)
	}
	t, err := s.st.FinishTask(r.Context(), st.ID, id, a.State, a.Result)
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Info("task finished", zap.String("edge", st.ID), zap.Int64("task", id), zap.String("cell", t.Cell),
		zap.String("action", t.Action), zap.String("state", t.State), zap.String("result", t.Result))
	w.WriteHeader(http.StatusNoContent)
	return nil
}
