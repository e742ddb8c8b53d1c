// Package tlsseal seals a certificate's private key to one edge with HPKE
// (RFC 9180: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM), the
// HPKE info binding the edge id, the domain and the certificate's
// fingerprint, and opens it on that edge. It owns the edges' encryption
// key pairs and their key file. The control API seals, the agent opens:
// controlapi, controlclient, activation and agent import it.
package tlsseal

import (
	"crypto/ecdh"
	"crypto/hpke"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"

	"cellvisor/manifest"
)

// infoPrefix separates these seals from any other use of HPKE with the
// same keys.
const infoPrefix = "cellvisor tls key v1"

// MaxKeyBytes bounds a sealed PEM private key (an RSA 8192 key's PEM is
// about 6.5 KiB).
const MaxKeyBytes = 16 << 10

// Errors of Open, by what is wrong.
var (
	// ErrUnknownKey: the seal names an encryption key that is not this
	// edge's.
	ErrUnknownKey = errors.New("sealed to an unknown encryption key")
	// ErrOpen: HPKE refused the seal: made for another edge, domain or
	// certificate, or tampered with.
	ErrOpen = errors.New("seal does not open: for another edge, domain or certificate, or tampered with")
	// ErrMalformed: the seal's fields are not what Seal makes.
	ErrMalformed = errors.New("malformed seal")
)

// The suite: the KEM is DHKEM(X25519, HKDF-SHA256), which the X25519
// keys (hpke.NewDHKEMPublicKey, NewDHKEMPrivateKey) select.
var (
	kdf  = hpke.HKDFSHA256()
	aead = hpke.AES256GCM()
)

// GenerateKey makes an edge's encryption key pair.
func GenerateKey() (*ecdh.PrivateKey, error) {
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate encryption key: %w", err)
	}
	return k, nil
}

// EncodePrivate is the key file's content: PKCS #8 in PEM.
func EncodePrivate(k *ecdh.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encode encryption key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// DecodePrivate reads what EncodePrivate wrote: an X25519 key and nothing
// else.
func DecodePrivate(data []byte) (*ecdh.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("encryption key: not a PEM PRIVATE KEY")
	}
	k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	ek, ok := k.(*ecdh.PrivateKey)
	if !ok || ek.Curve() != ecdh.X25519() {
		return nil, errors.New("encryption key: not an X25519 key")
	}
	return ek, nil
}

// EncodePublic is a public key as the control API takes it: standard
// base64 of its 32 bytes.
func EncodePublic(pub *ecdh.PublicKey) string { return base64.StdEncoding.EncodeToString(pub.Bytes()) }

// DecodePublic reads what EncodePublic wrote.
func DecodePublic(s string) (*ecdh.PublicKey, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != 32 {
		return nil, errors.New("encryption key: want the standard base64 of a 32-byte X25519 public key")
	}
	pub, err := ecdh.X25519().NewPublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	return pub, nil
}

// KeyID is the hex SHA-256 of a public key's bytes: how a seal names the
// key it is sealed to.
func KeyID(pub *ecdh.PublicKey) string {
	sum := sha256.Sum256(pub.Bytes())
	return hex.EncodeToString(sum[:])
}

// info binds a seal to its edge, domain and certificate: each field
// length-prefixed, so no two triples give the same bytes.
func info(edgeID, domain, fingerprint string) []byte {
	b := []byte(infoPrefix)
	for _, f := range []string{edgeID, domain, fingerprint} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	return b
}

// Seal seals a PEM private key to pub for one edge, domain and
// certificate fingerprint.
func Seal(pub *ecdh.PublicKey, edgeID, domain, fingerprint string, keyPEM []byte) (manifest.SealedKey, error) {
	if len(keyPEM) == 0 || len(keyPEM) > MaxKeyBytes {
		return manifest.SealedKey{}, fmt.Errorf("seal key: 1–%d bytes, got %d", MaxKeyBytes, len(keyPEM))
	}
	pk, err := hpke.NewDHKEMPublicKey(pub)
	if err != nil {
		return manifest.SealedKey{}, fmt.Errorf("seal key: %w", err)
	}
	enc, s, err := hpke.NewSender(pk, kdf, aead, info(edgeID, domain, fingerprint))
	if err != nil {
		return manifest.SealedKey{}, fmt.Errorf("seal key: %w", err)
	}
	ct, err := s.Seal(nil, keyPEM)
	if err != nil {
		return manifest.SealedKey{}, fmt.Errorf("seal key: %w", err)
	}
	return manifest.SealedKey{KeyID: KeyID(pub), Enc: base64.StdEncoding.EncodeToString(enc),
		Sealed: base64.StdEncoding.EncodeToString(ct)}, nil
}

// Open opens a seal with the edge's private key: ErrUnknownKey when it is
// sealed to another key, ErrOpen when HPKE refuses it (another edge,
// domain or fingerprint, or tampered with), ErrMalformed for bad fields.
func Open(priv *ecdh.PrivateKey, edgeID, domain, fingerprint string, k manifest.SealedKey) ([]byte, error) {
	if k.KeyID != KeyID(priv.PublicKey()) {
		return nil, fmt.Errorf("key of %s: key id %.16s…: %w", domain, k.KeyID, ErrUnknownKey)
	}
	enc, err := base64.StdEncoding.DecodeString(k.Enc)
	if err != nil || len(enc) != 32 {
		return nil, fmt.Errorf("key of %s: enc: %w", domain, ErrMalformed)
	}
	ct, err := base64.StdEncoding.DecodeString(k.Sealed)
	if err != nil || len(ct) > MaxKeyBytes+16 {
		return nil, fmt.Errorf("key of %s: sealed: %w", domain, ErrMalformed)
	}
	sk, err := hpke.NewDHKEMPrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", domain, err)
	}
	r, err := hpke.NewRecipient(enc, sk, kdf, aead, info(edgeID, domain, fingerprint))
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", domain, ErrOpen)
	}
	pt, err := r.Open(nil, ct)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", domain, ErrOpen)
	}
	return pt, nil
}
