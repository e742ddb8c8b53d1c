package controlapi

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
)

// RetryGrace is how long after its use an exact retry of an enrollment
// is still answered when the token has expired meanwhile: an agent that
// enrolled a moment before expiry and lost the answer gets it again,
// without a rotation.
const RetryGrace = time.Hour

// tokenTTL parses an admin request's token lifetime: a Go duration, or
// empty for adminapi.DefaultTokenTTL.
func tokenTTL(field, v string) (time.Duration, error) {
	if v == "" {
		return adminapi.DefaultTokenTTL, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < adminapi.MinTokenTTL || d > adminapi.MaxTokenTTL {
		return 0, errorf(http.StatusBadRequest, "%s: %q: want a duration from %s to %s, such as 24h", field, v, adminapi.MinTokenTTL, adminapi.MaxTokenTTL)
	}
	return d, nil
}

func hashCSR(csr *x509.CertificateRequest) string {
	sum := sha256.Sum256(csr.Raw)
	return hex.EncodeToString(sum[:])
}

// sameKey reports whether a PEM certificate is for the CSR's key.
func sameKey(certPEM string, csr *x509.CertificateRequest) bool {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil {
		return false
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return false
	}
	k, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(csr.PublicKey)
}

// enrollRetry answers an exact retry of an enrollment (same token, same
// CSR): the answer the first attempt may not have received. It is answered
// until the token's expiry, or RetryGrace after its use if that is later,
// and only while the certificate it got is the edge's current one: after a
// renewal the edge has no use for it.
func (s *Server) enrollRetry(w http.ResponseWriter, r *http.Request, e store.Edge, csr *x509.CertificateRequest, enc string, now time.Time) error {
	until := e.TokenExpiresAt
	if g := e.EnrolledAt.Add(RetryGrace); g.After(until) {
		until = g
	}
	if !e.TokenExpiresAt.IsZero() && !now.Before(until) {
		s.log.Warn("security: enrollment retried with an expired bootstrap token", zap.String("edge", e.ID), zap.String("remote", r.RemoteAddr))
		return errorf(http.StatusUnauthorized, "bootstrap token expired at %s (used at %s); rotate the edge for a new one",
			e.TokenExpiresAt.UTC().Format(time.RFC3339), e.EnrolledAt.UTC().Format(time.RFC3339))
	}
	if !sameKey(e.CertPEM, csr) {
		return errorf(http.StatusConflict, "bootstrap token already used, and the edge has renewed its certificate since; rotate the edge's identity for a new token")
	}
	// The first attempt may have ended before the key was registered.
	if err := s.registerEncryptionKey(r.Context(), e.ID, enc); err != nil {
		return err
	}
	s.log.Info("enrollment retried", zap.String("edge", e.ID))
	return s.writeEnrolled(w, e.ID, e.Org, e.CertPEM, e.Slots)
}

// renew issues a renewed client certificate for the edge whose current
// certificate authenticated the request. The new one is pending: the
// current one stays valid until the edge first uses the new one (promote).
// The same CSR again gets the same certificate; another CSR replaces a
// pending one never used.
func (s *Server) renew(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var req edgeapi.RenewRequest
	if err := decode(r, edgeapi.MaxEnrollBytes, &req); err != nil {
		return err
	}
	csr, err := pki.ParseCSR(req.CSR)
	if err != nil {
		return errorf(http.StatusBadRequest, "%v", err)
	}
	e, err := s.st.Edge(r.Context(), st.ID)
	if err != nil {
		return err
	}
	csrHash := hashCSR(csr)
	if e.PendingCSRHash == csrHash && e.PendingCertPEM != "" {
		s.log.Info("certificate renewal retried", zap.String("edge", e.ID), zap.String("serial", e.PendingSerial))
		return s.writeRenewed(w, e.PendingCertPEM)
	}
	if sameKey(e.CertPEM, csr) {
		return errorf(http.StatusBadRequest, "renewal CSR is for the current certificate's key: renew with a new key")
	}
	current := pki.SerialHex(r.TLS.VerifiedChains[0][0])
	cert, certPEM, err := s.ca.IssueClientFor(csr, e.ID, s.o.Now(), s.o.ClientCertTTL)
	if err != nil {
		return err
	}
	serial := pki.SerialHex(cert)
	if err := s.st.SetPending(r.Context(), e.ID, current, csrHash, certPEM, serial); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return errorf(http.StatusUnauthorized, "client certificate is no longer edge %s's current identity (rotated or renewed meanwhile)", e.ID)
		}
		return err
	}
	s.log.Info("certificate renewed; pending until the edge uses it", zap.String("edge", e.ID),
		zap.String("serial", serial), zap.String("current", current), zap.Time("not_after", cert.NotAfter))
	return s.writeRenewed(w, certPEM)
}

func (s *Server) writeRenewed(w http.ResponseWriter, certPEM string) error {
	writeJSON(w, http.StatusOK, edgeapi.RenewResponse{Certificate: certPEM, CA: s.ca.PEM})
	return nil
}

// promote makes serial the edge's current certificate when it is the
// renewed one pending, on its first use, which revokes the one it
// replaces. It returns the edge's state when serial is current after.
//
// The first uses of a renewed certificate arrive together (an agent's poll
// beside the encryption key it registers after a switch): one that looked
// at the cache before another promoted it finds it current in the
// database, and is answered as current, not refused.
func (s *Server) promote(ctx context.Context, id, serial string) (store.EdgeState, bool, error) {
	e, err := s.st.Edge(ctx, id)
	if errors.Is(err, store.ErrNotFound) || err == nil && (serial == "" || e.PendingSerial != serial && e.CertSerial != serial) {
		return store.EdgeState{}, false, nil
	}
	if err != nil {
		return store.EdgeState{}, false, err
	}
	promoted := e.PendingSerial == serial
	if promoted {
		err = s.st.PromotePending(ctx, id, serial)
	}
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return store.EdgeState{}, false, err
	}
	// On a conflict a concurrent request promoted it first, or a rotation
	// took it away: the cache, refreshed, says which.
	s.refresh(ctx)
	st, ok := s.cache.current(ctx, id, serial)
	if ok && promoted && err == nil {
		s.log.Info("edge switched to its renewed certificate; the previous one is revoked",
			zap.String("edge", id), zap.String("serial", serial), zap.String("revoked", e.CertSerial))
	}
	return st, ok, nil
}

// certExpiry is when a PEM certificate expires, nil if it cannot be read.
func certExpiry(certPEM string) *time.Time {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil {
		return nil
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil
	}
	t := cert.NotAfter.UTC()
	return &t
}
