package domain

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// TLS is a domain's HTTPS: which certificate its cells present for its
// hostnames, and what its plain-HTTP port does.
//
// An operator's document names a certificate uploaded to the control API
// (Certificate) or asks for one from an ACME CA (ACME). The control API
// fills Chain and Fingerprint when it publishes (an operator's document
// carrying them is refused there), and the certificate's private key
// travels beside the artifact, sealed to each edge (manifest.SealedKey).
type TLS struct {
	// Certificate names an uploaded certificate (cellvisor-control cert
	// add). Exactly one of Certificate and ACME.
	Certificate string `json:"certificate,omitempty"`
	// ACME has the control API obtain and renew the certificate.
	ACME bool `json:"acme,omitempty"`
	// RedirectHTTP answers plain-HTTP requests with 301 to https://
	// (but for ACME's HTTP-01 challenges), once the domain has a
	// certificate on the cell.
	RedirectHTTP bool `json:"redirect_http,omitempty"`
	// HSTS, when set, adds Strict-Transport-Security to HTTPS answers.
	HSTS *HSTS `json:"hsts,omitempty"`

	// Chain is the certificate chain in PEM, leaf first (filled at
	// publish; empty for an ACME domain whose certificate is not issued).
	Chain string `json:"chain,omitempty"`
	// Fingerprint is the hex SHA-256 of the leaf's DER (filled at
	// publish with Chain): what status, logs and the fleet page show.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Challenges are pending ACME HTTP-01 challenges, answered by the
	// cells at /.well-known/acme-challenge/<token> on the HTTP port.
	Challenges []ACMEChallenge `json:"acme_challenges,omitempty"`
}

// HSTS is a Strict-Transport-Security header.
type HSTS struct {
	MaxAgeSeconds     int64 `json:"max_age_seconds"`
	IncludeSubdomains bool  `json:"include_subdomains,omitempty"`
	Preload           bool  `json:"preload,omitempty"`
}

// ACMEChallenge is one HTTP-01 challenge: the token in the URL and the key
// authorization the answer carries (neither is secret: the CA publishes
// both to whoever asks).
type ACMEChallenge struct {
	Token            string `json:"token"`
	KeyAuthorization string `json:"key_authorization"`
}

// Bounds of a domain's TLS.
const (
	// MaxChainBytes is the longest certificate chain, in PEM bytes.
	MaxChainBytes = 64 << 10
	// MaxChainCerts is the most certificates in a chain.
	MaxChainCerts = 8
	// MaxChallenges is the most pending ACME challenges (one a hostname
	// being validated at once, a few at a time).
	MaxChallenges = 16
	// MaxHSTSAge is the longest HSTS max-age: two years.
	MaxHSTSAge = 2 * 365 * 86400
)

// HasCertificate reports whether the document carries a certificate chain
// for its cells to present.
func (d *Domain) HasCertificate() bool { return d.TLS != nil && d.TLS.Chain != "" }

func (t *TLS) validate() error {
	switch {
	case t.Certificate != "" && t.ACME:
		return errors.New("tls: certificate and acme are exclusive")
	case t.Certificate == "" && !t.ACME:
		return errors.New("tls: name a certificate or set acme")
	case t.Certificate != "" && !validName(t.Certificate):
		return fmt.Errorf("tls certificate %q: must be 1–64 of lowercase letters, digits, '_' and '-'", t.Certificate)
	}
	if t.HSTS != nil && (t.HSTS.MaxAgeSeconds < 0 || t.HSTS.MaxAgeSeconds > MaxHSTSAge) {
		return fmt.Errorf("tls hsts max_age_seconds must be 0–%d, got %d", MaxHSTSAge, t.HSTS.MaxAgeSeconds)
	}
	if (t.Chain == "") != (t.Fingerprint == "") {
		return errors.New("tls: chain and fingerprint come together")
	}
	if t.Chain != "" {
		fp, err := chainFingerprint(t.Chain)
		if err != nil {
			return err
		}
		if fp != t.Fingerprint {
			return fmt.Errorf("tls fingerprint %s is not the chain's leaf (%s)", t.Fingerprint, fp)
		}
	}
	if len(t.Challenges) > MaxChallenges {
		return fmt.Errorf("tls acme_challenges: at most %d, got %d", MaxChallenges, len(t.Challenges))
	}
	for _, c := range t.Challenges {
		if !validToken(c.Token) || !strings.HasPrefix(c.KeyAuthorization, c.Token+".") || !validToken(c.KeyAuthorization[len(c.Token)+1:]) {
			return fmt.Errorf("tls acme_challenges: token %q: token and key_authorization must be base64url (1–128), the key authorization token.thumbprint", c.Token)
		}
	}
	return nil
}

// chainFingerprint checks a PEM chain's form (only CERTIFICATE blocks that
// parse, 1–MaxChainCerts of them, nothing else) and gives its leaf's
// fingerprint. Whether it covers the hostnames and is in date is the
// control API's check at upload and publish; an edge presents what was
// signed.
func chainFingerprint(chain string) (string, error) {
	if len(chain) > MaxChainBytes {
		return "", fmt.Errorf("tls chain: at most %d bytes, got %d", MaxChainBytes, len(chain))
	}
	rest := []byte(chain)
	var leaf []byte
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return "", fmt.Errorf("tls chain: a %q block: only certificates", b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return "", fmt.Errorf("tls chain: certificate %d: %v", n+1, err)
		}
		if n == 0 {
			leaf = b.Bytes
		}
		if n++; n > MaxChainCerts {
			return "", fmt.Errorf("tls chain: at most %d certificates", MaxChainCerts)
		}
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return "", errors.New("tls chain: not a PEM certificate chain")
	}
	sum := sha256.Sum256(leaf)
	return hex.EncodeToString(sum[:]), nil
}

// ChainFingerprint is the hex SHA-256 of a PEM chain's leaf certificate.
func ChainFingerprint(chain string) (string, error) { return chainFingerprint(chain) }

// validToken reports 1–128 base64url characters (no padding).
func validToken(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
