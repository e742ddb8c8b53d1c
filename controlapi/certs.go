package controlapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/certcheck"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

// CertKEKSetting is the setting holding the certificate key-encryption
// key, sealed with the seal key as the signing key is: every replica on
// one database shares it.
const CertKEKSetting = "cert_kek"

// DefaultCertMargin is how long a certificate must still be valid for a
// domain to be published with it.
const DefaultCertMargin = 7 * 24 * time.Hour

// initCertKEK creates the certificate key-encryption key on first start
// (the first of several replicas starting together wins) and opens it.
func (s *Server) initCertKEK(ctx context.Context) error {
	kek := make([]byte, 32)
	if _, err := rand.Read(kek); err != nil {
		return err
	}
	sealed, err := pki.Seal(s.o.SealKey, "cert-kek", kek)
	if err != nil {
		return err
	}
	stored, err := s.st.InitSetting(ctx, CertKEKSetting, sealed)
	if err != nil {
		return err
	}
	if s.kek, err = pki.Open(s.o.SealKey, "cert-kek", stored); err != nil {
		return fmt.Errorf("certificate key-encryption key: %w", err)
	}
	if len(s.kek) != 32 {
		return errors.New("certificate key-encryption key: stored key has the wrong size")
	}
	return nil
}

// keyLabel binds a key encrypted at rest to its certificate's leaf.
func keyLabel(fingerprint string) string { return "cert-key:" + fingerprint }

// sealCertKey is the store's KeySealer: it opens a key encrypted at rest
// and seals it to the edge. The opened key lives for the call.
func (s *Server) sealCertKey(edgeID, dom, fp, enc, atRest string) (*manifest.SealedKey, error) {
	pub, err := tlsseal.DecodePublic(enc)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pki.Open(s.kek, keyLabel(fp), atRest)
	if err != nil {
		return nil, err
	}
	k, err := tlsseal.Seal(pub, edgeID, dom, fp, keyPEM)
	clear(keyPEM)
	if err != nil {
		return nil, err
	}
	return &k, nil
}

func certView(c store.Certificate) adminapi.CertificateView {
	return adminapi.CertificateView{Name: c.Name, Fingerprint: c.Fingerprint, Names: c.Names, Issuer: c.Issuer, KeyType: c.KeyType,
		NotBefore: c.NotBefore, NotAfter: c.NotAfter, UpdatedAt: c.UpdatedAt, UsedBy: c.UsedBy}
}

// StoreCertificate validates a chain and its key (certcheck.Check) and
// stores them under name, the key encrypted at rest; with replace it
// replaces one of that name and republishes, each at a new revision, the
// domains that use it. An issuer (ACME) stores what it obtained with it.
func (s *Server) StoreCertificate(ctx context.Context, name string, chainPEM, keyPEM []byte, replace bool) (adminapi.CertificateView, error) {
	if !validCertName(name) {
		return adminapi.CertificateView{}, errorf(http.StatusBadRequest, "certificate name %q: must be 1–64 of lowercase letters, digits, '_' and '-'", name)
	}
	chain, info, err := certcheck.Check(chainPEM, keyPEM, s.o.Now())
	if err != nil {
		return adminapi.CertificateView{}, errorf(http.StatusBadRequest, "%v", err)
	}
	if replace {
		// Refused before anything changes when a domain using the
		// certificate could not be published with the new one.
		if err := s.checkReplacement(ctx, name, info); err != nil {
			return adminapi.CertificateView{}, err
		}
	}
	atRest, err := pki.Seal(s.kek, keyLabel(info.Fingerprint), keyPEM)
	if err != nil {
		return adminapi.CertificateView{}, err
	}
	c := store.Certificate{Name: name, Fingerprint: info.Fingerprint, Chain: chain, Names: info.Names, Issuer: info.Issuer,
		KeyType: info.KeyType, NotBefore: info.NotBefore, NotAfter: info.NotAfter}
	used, err := s.st.PutCertificate(ctx, c, atRest, replace)
	if err != nil {
		return adminapi.CertificateView{}, err
	}
	s.log.Info("certificate stored", zap.String("certificate", name), zap.String("fingerprint", info.Fingerprint),
		zap.Strings("names", info.Names), zap.Time("not_after", info.NotAfter), zap.Bool("replace", replace))
	stored, err := s.st.Certificate(ctx, name)
	if err != nil {
		return adminapi.CertificateView{}, err
	}
	v := certView(stored)
	for _, d := range used {
		rev, err := s.republishTLS(ctx, d)
		if err != nil {
			if v.Failed == nil {
				v.Failed = map[string]string{}
			}
			v.Failed[d] = err.Error()
			s.log.Warn("domain not republished with its replaced certificate", zap.String("domain", d), zap.String("certificate", name), zap.Error(err))
			continue
		}
		if v.Republished == nil {
			v.Republished = map[string]int64{}
		}
		v.Republished[d] = rev
	}
	if len(used) > 0 {
		s.refresh(ctx)
	}
	return v, nil
}

// checkReplacement checks that every domain using certificate name would
// be published with the new one (info): it covers their hostnames and is
// valid beyond the margin.
func (s *Server) checkReplacement(ctx context.Context, name string, info certcheck.Info) error {
	cur, err := s.st.Certificate(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if until := s.o.Now().Add(s.o.CertMargin); len(cur.UsedBy) > 0 && info.NotAfter.Before(until) {
		return errorf(http.StatusBadRequest, "replacement of %q expires at %s, within the margin of %s, and %s use it",
			name, info.NotAfter.Format(time.RFC3339), s.o.CertMargin, strings.Join(cur.UsedBy, ", "))
	}
	for _, dn := range cur.UsedBy {
		d, err := s.st.Domain(ctx, dn)
		if err != nil {
			return err
		}
		_, data, err := s.st.Revision(ctx, dn, d.Revision)
		if err != nil {
			return err
		}
		doc, err := domain.Decode(data)
		if err != nil {
			continue // its republish reports it
		}
		if miss := certcheck.Covers(info.Names, doc.Hostnames); miss != "" {
			return errorf(http.StatusBadRequest, "replacement of %q does not cover hostname %s of domain %s, which uses it (its names: %v)", name, miss, dn, info.Names)
		}
	}
	return nil
}

// republishTLS publishes a domain's current configuration again at a new
// revision, its certificate's chain and fingerprint filled anew.
func (s *Server) republishTLS(ctx context.Context, name string) (int64, error) {
	cur, err := s.st.Domain(ctx, name)
	if err != nil {
		return 0, err
	}
	_, data, err := s.st.Revision(ctx, name, cur.Revision)
	if err != nil {
		return 0, err
	}
	d, err := domain.Decode(data)
	if err != nil {
		return 0, fmt.Errorf("current revision no longer decodes: %w", err)
	}
	if err := s.fillTLS(ctx, &d); err != nil {
		return 0, err
	}
	d.Domain, d.Pool, d.Revision = "", "", 0
	config, err := json.Marshal(d)
	if err != nil {
		return 0, err
	}
	p, err := s.st.PublishDomain(ctx, name, cur.Pool, d.Hostnames, func(rev int64) ([]byte, error) {
		_, data, err := domainArtifact(name, cur.Pool, config, rev)
		return data, err
	})
	if err != nil {
		return 0, err
	}
	s.log.Info("domain republished with its certificate", zap.String("domain", name), zap.Int64("revision", p.Domain.Revision),
		zap.String("fingerprint", d.TLS.Fingerprint))
	return p.Domain.Revision, nil
}

// refuseControlFields refuses an operator's document that carries what
// the control API fills in at publish.
func refuseControlFields(d *domain.Domain) error {
	if d.TLS == nil {
		return nil
	}
	if d.TLS.Chain != "" || d.TLS.Fingerprint != "" || len(d.TLS.Challenges) > 0 {
		return errorf(http.StatusBadRequest, "config: tls chain, fingerprint and acme_challenges are filled by the control API at publish: leave them out")
	}
	return nil
}

// fillTLS checks the certificate a domain names (it exists, covers every
// hostname, is valid beyond the margin) and fills the domain's chain and
// fingerprint from it. A domain with no certificate named is left as it
// is.
func (s *Server) fillTLS(ctx context.Context, d *domain.Domain) error {
	if d.TLS != nil && d.TLS.ACME {
		return s.fillACME(ctx, d)
	}
	if d.TLS == nil || d.TLS.Certificate == "" {
		return nil
	}
	c, err := s.st.Certificate(ctx, d.TLS.Certificate)
	if errors.Is(err, store.ErrNotFound) {
		return errorf(http.StatusBadRequest, "tls certificate %q: no such certificate (cellvisor-control cert add)", d.TLS.Certificate)
	}
	if err != nil {
		return err
	}
	if miss := certcheck.Covers(c.Names, d.Hostnames); miss != "" {
		return errorf(http.StatusBadRequest, "tls certificate %q does not cover hostname %s (its names: %v; a wildcard covers one label)", c.Name, miss, c.Names)
	}
	if until := s.o.Now().Add(s.o.CertMargin); c.NotAfter.Before(until) {
		return errorf(http.StatusBadRequest, "tls certificate %q expires at %s, within the margin of %s: replace it first",
			c.Name, c.NotAfter.Format(time.RFC3339), s.o.CertMargin)
	}
	d.TLS.Chain, d.TLS.Fingerprint = c.Chain, c.Fingerprint
	return nil
}

func (s *Server) putCertificate(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.CertificateRequest
	if err := decode(r, 2*(domain.MaxChainBytes+certcheck.MaxKeyBytes), &req); err != nil {
		return err
	}
	v, err := s.StoreCertificate(r.Context(), r.PathValue("name"), []byte(req.Chain), []byte(req.Key), req.Replace)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) listCertificates(w http.ResponseWriter, r *http.Request) error {
	cs, err := s.st.Certificates(r.Context())
	if err != nil {
		return err
	}
	out := []adminapi.CertificateView{}
	for _, c := range cs {
		out = append(out, certView(c))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) showCertificate(w http.ResponseWriter, r *http.Request) error {
	c, err := s.st.Certificate(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, certView(c))
	return nil
}

func (s *Server) deleteCertificate(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.st.DeleteCertificate(r.Context(), name); err != nil {
		return err
	}
	s.log.Info("certificate deleted", zap.String("certificate", name))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// validCertName is the rule a domain's tls.certificate follows: 1–64 of
// lowercase letters, digits, '_' and '-' (no dots: an issuer names one
// for a domain acme-example-com).
func validCertName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// fillACME fills an ACME domain's chain and fingerprint from the
// certificate issued for it, where there is one that covers its hostnames
// and has not expired; otherwise the domain is published without (its
// cells serve it over HTTP until one is issued).
func (s *Server) fillACME(ctx context.Context, d *domain.Domain) error {
	c, err := s.st.Certificate(ctx, acmeCertName(d.Domain))
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if certcheck.Covers(c.Names, d.Hostnames) == "" && c.NotAfter.After(s.o.Now()) {
		d.TLS.Chain, d.TLS.Fingerprint = c.Chain, c.Fingerprint
	}
	return nil
}

// acmeCertName is the certificate an ACME domain's issued certificate is
// kept as: "acme_" and the domain with its dots as underscores (no DNS
// name has one, so no two domains share a name); a domain too long for a
// certificate name keeps its first 40 characters and a hash of the whole.
func acmeCertName(d string) string {
	n := "acme_" + strings.ReplaceAll(d, ".", "_")
	if len(n) <= 64 {
		return n
	}
	sum := sha256.Sum256([]byte(d))
	return n[:45] + "_" + hex.EncodeToString(sum[:])[:16]
}

// PutACME keeps a certificate the ACME issuer obtained for domain name as
// acmeCertName(name) (its key encrypted at rest, like an uploaded one's)
// and publishes the domain again with its chain: the ACME scheduler's
// store.
func (s *Server) PutACME(ctx context.Context, name string, chainPEM, keyPEM []byte) error {
	if _, err := s.StoreCertificate(ctx, acmeCertName(name), chainPEM, keyPEM, true); err != nil {
		return fmt.Errorf("keep the certificate issued for %s: %w", name, err)
	}
	if _, err := s.republishTLS(ctx, name); err != nil {
		return fmt.Errorf("publish %s with its issued certificate: %w", name, err)
	}
	return nil
}
