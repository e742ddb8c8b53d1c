package controlapi

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
	"cellvisor/manifest"
)

// rollbackDomain republishes a domain's earlier revision, its artifact as
// it was, marked as a signed rollback so that edges take the lower
// revision.
func (s *Server) rollbackDomain(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.RollbackRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	name := r.PathValue("name")
	if req.To < 1 || req.To > manifest.MaxSequence {
		return errorf(http.StatusBadRequest, "to: want a revision 1–%d", int64(manifest.MaxSequence))
	}
	_, data, err := s.st.Revision(r.Context(), name, req.To)
	if err != nil {
		return err
	}
	d, err := domain.Decode(data)
	if err != nil {
		return errorf(http.StatusConflict, "revision %d of %s no longer decodes: %v", req.To, name, err)
	}
	if d.TLS != nil && d.TLS.Fingerprint != "" {
		// Its edges would get no key: refused, the current revision kept.
		if ok, err := s.st.HasCertificateKey(r.Context(), d.TLS.Fingerprint); err != nil {
			return err
		} else if !ok {
			return errorf(http.StatusConflict, "revision %d of %s presents certificate %s, whose key was deleted (cert delete): publish it with a certificate instead",
				req.To, name, d.TLS.Fingerprint)
		}
	}
	p, err := s.st.RollbackDomain(r.Context(), name, req.To, d.Hostnames)
	if errors.Is(err, store.ErrConflict) {
		return errorf(http.StatusConflict, "%v", err)
	}
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	s.log.Warn("domain rolled back", zap.String("domain", name), zap.Int64("revision", req.To), zap.Int64("publish", p.Fanout), zap.Int("edges", p.Pending))
	writeJSON(w, http.StatusOK, publishedView(p))
	return nil
}

// rotateKey replaces the signing key: see store.RotateKey.
func (s *Server) rotateKey(w http.ResponseWriter, r *http.Request) error {
	previous := s.PublicKey()
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	sealed, err := pki.Seal(s.o.SealKey, "signing-key", next.Seed())
	if err != nil {
		return err
	}
	rot, err := s.st.RotateKey(r.Context(), s.sign, next, sealed)
	if errors.Is(err, store.ErrConflict) {
		return errorf(http.StatusConflict, "%v", err)
	}
	if err != nil {
		return err
	}
	s.refresh(r.Context())
	v := adminapi.RotatedView{PublicKey: rot.Rotation.To, Previous: previous, Edges: map[string]int64{}}
	for _, e := range rot.Edges {
		v.Edges[e.EdgeID] = e.Sequence
	}
	s.log.Warn("signing key rotated", zap.String("from", rot.Rotation.From), zap.String("to", rot.Rotation.To), zap.Int("edges", len(rot.Edges)))
	writeJSON(w, http.StatusOK, v)
	return nil
}
