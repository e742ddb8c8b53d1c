// Package certcheck validates a certificate chain and its private key as
// an operator uploads them to the control API, and whether a certificate
// covers a domain's hostnames. It holds no key longer than a call; only
// controlapi imports it.
package certcheck

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Bounds of an upload. The chain's are the edges' own (domain.MaxChainBytes
// and domain.MaxChainCerts, which a test holds them to).
const (
	MaxKeyBytes   = 16 << 10
	MaxChainBytes = 64 << 10
	MaxChainCerts = 8
)

// ErrInvalid marks every refusal; its text names the rule.
var ErrInvalid = errors.New("certificate refused")

// Info is what may be shown of a certificate: never its key.
type Info struct {
	Fingerprint string    // hex SHA-256 of the leaf's DER
	Names       []string  // the leaf's DNS SANs
	Issuer      string    // the leaf's issuer
	NotBefore   time.Time // the leaf's validity
	NotAfter    time.Time
	KeyType     string // rsa-2048, ecdsa-p256, ed25519, …
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Check validates a PEM chain (leaf first) and its PEM private key at now:
// sizes, PEM parse, only certificates in the chain, the key matching the
// leaf, each certificate signed by the next, the leaf in date, the key's
// type. It returns the chain re-encoded (certificates only) and its Info.
func Check(chainPEM, keyPEM []byte, now time.Time) (string, Info, error) {
	switch {
	case len(chainPEM) == 0 || len(chainPEM) > MaxChainBytes:
		return "", Info{}, bad("size: the chain must be 1–%d bytes, got %d", MaxChainBytes, len(chainPEM))
	case len(keyPEM) == 0 || len(keyPEM) > MaxKeyBytes:
		return "", Info{}, bad("size: the key must be 1–%d bytes, got %d", MaxKeyBytes, len(keyPEM))
	}
	var certs []*x509.Certificate
	var out bytes.Buffer
	rest := chainPEM
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return "", Info{}, bad("pem: the chain holds a %q block: certificates only (the key goes in --key)", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return "", Info{}, bad("pem: certificate %d does not parse: %v", len(certs)+1, err)
		}
		if certs = append(certs, c); len(certs) > MaxChainCerts {
			return "", Info{}, bad("size: at most %d certificates in a chain", MaxChainCerts)
		}
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes})
	}
	if len(certs) == 0 || len(bytes.TrimSpace(rest)) != 0 {
		return "", Info{}, bad("pem: the chain is not PEM certificates")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || !strings.HasSuffix(kb.Type, "PRIVATE KEY") {
		return "", Info{}, bad("pem: the key is not a PEM private key")
	}
	if _, err := tls.X509KeyPair(out.Bytes(), keyPEM); err != nil {
		for i, c := range certs[1:] {
			if _, e := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), keyPEM); e == nil {
				return "", Info{}, bad("chain order: the key's certificate is number %d: leaf first, each followed by its issuer", i+2)
			}
		}
		return "", Info{}, bad("key match: the key is not the leaf certificate's: %v", err)
	}
	leaf := certs[0]
	kt, err := keyType(leaf)
	if err != nil {
		return "", Info{}, err
	}
	for i := 0; i+1 < len(certs); i++ {
		if err := certs[i].CheckSignatureFrom(certs[i+1]); err != nil {
			return "", Info{}, bad("chain order: certificate %d (%s) is not signed by certificate %d (%s): leaf first, each followed by its issuer",
				i+1, certs[i].Subject, i+2, certs[i+1].Subject)
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return "", Info{}, bad("validity: the leaf expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return "", Info{}, bad("validity: the leaf is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	case len(leaf.DNSNames) == 0:
		return "", Info{}, bad("names: the leaf has no DNS subject alternative names")
	}
	sum := sha256.Sum256(leaf.Raw)
	return out.String(), Info{Fingerprint: hex.EncodeToString(sum[:]), Names: leaf.DNSNames, Issuer: leaf.Issuer.String(),
		NotBefore: leaf.NotBefore.UTC(), NotAfter: leaf.NotAfter.UTC(), KeyType: kt}, nil
}

// keyType names the leaf's key, refusing all but RSA ≥ 2048 bits, ECDSA
// P-256 or P-384 and Ed25519.
func keyType(c *x509.Certificate) (string, error) {
	switch k := c.PublicKey.(type) {
	case *rsa.PublicKey:
		if n := k.N.BitLen(); n < 2048 {
			return "", bad("key type: RSA %d bits, at least 2048", n)
		} else {
			return fmt.Sprintf("rsa-%d", n), nil
		}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ecdsa-p256", nil
		case elliptic.P384():
			return "ecdsa-p384", nil
		}
		return "", bad("key type: ECDSA %s, only P-256 or P-384", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return "ed25519", nil
	}
	return "", bad("key type: %T, only RSA ≥ 2048, ECDSA P-256/P-384 or Ed25519", c.PublicKey)
}

// Covers reports the first of hostnames the names do not cover ("" when
// all are): a name covers itself, and "*.example.com" covers one label
// more ("a.example.com", not "example.com" nor "a.b.example.com").
// Hostnames in domain documents may be wildcards themselves, covered only
// by the same wildcard.
func Covers(names, hostnames []string) string {
	for _, h := range hostnames {
		if !covered(names, strings.ToLower(h)) {
			return h
		}
	}
	return ""
}

func covered(names []string, h string) bool {
	for _, n := range names {
		n = strings.ToLower(n)
		if n == h {
			return true
		}
		if suffix, ok := strings.CutPrefix(n, "*."); ok && !strings.HasPrefix(h, "*.") {
			if label, rest, ok := strings.Cut(h, "."); ok && label != "" && rest == suffix {
				return true
			}
		}
	}
	return false
}
