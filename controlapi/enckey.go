package controlapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"net/http"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
	"cellvisor/tlsseal"
)

// enrollHash is what an exact enrollment retry must repeat: the CSR and
// the encryption key sent with it (none: the CSR's hash alone, as before
// encryption keys).
func enrollHash(csr *x509.CertificateRequest, enc string) string {
	h := hashCSR(csr)
	if enc == "" {
		return h
	}
	sum := sha256.Sum256([]byte(h + "\n" + enc))
	return hex.EncodeToString(sum[:])
}

// registerEncryptionKey records an edge's encryption public key (none:
// nothing to do); a new one gives the edge's entries with a certificate
// keys sealed to it, at a new sequence.
func (s *Server) registerEncryptionKey(ctx context.Context, edgeID, enc string) error {
	if enc == "" {
		return nil
	}
	pub, err := tlsseal.DecodePublic(enc)
	if err != nil {
		return errorf(http.StatusBadRequest, "%v", err)
	}
	seq, advanced, err := s.st.SetEncryptionKey(ctx, edgeID, enc, s.sign)
	if err != nil {
		return err
	}
	if advanced {
		s.refresh(ctx)
		s.log.Info("edge encryption key registered; keys sealed to it", zap.String("edge", edgeID),
			zap.String("key_id", tlsseal.KeyID(pub)), zap.Int64("sequence", seq.Sequence))
	}
	return nil
}

// putEncryptionKey registers the encryption key of an edge enrolled
// before it sent one at enrollment (or one it replaced).
func (s *Server) putEncryptionKey(w http.ResponseWriter, r *http.Request, st store.EdgeState) error {
	var req edgeapi.EncryptionKeyRequest
	if err := decode(r, 4<<10, &req); err != nil {
		return err
	}
	if req.EncryptionKey == "" {
		return errorf(http.StatusBadRequest, "encryption_key: required")
	}
	if err := s.registerEncryptionKey(r.Context(), st.ID, req.EncryptionKey); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
