package tlsseal

import (
	"bytes"
	"crypto/hpke"
	"encoding/base64"
	"errors"
	"testing"

	"cellvisor/manifest"
)

var keyPEM = []byte("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIMx1wTkq0K7JqQpX5w9Yx0mNn7mQ3b0tR3J0j3l0gFQ1\n-----END PRIVATE KEY-----\n")

const fp = "aa00000000000000000000000000000000000000000000000000000000000000"

func TestSealOpen(t *testing.T) {
	priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	other, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	k, err := Seal(priv.PublicKey(), "edge-1", "example.com", fp, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Open(priv, "edge-1", "example.com", fp, k)
	if err != nil || !bytes.Equal(got, keyPEM) {
		t.Fatalf("open: %q, %v", got, err)
	}
	if bytes.Contains([]byte(k.Sealed+k.Enc), []byte("MC4CAQAw")) {
		t.Fatal("the seal carries the key in the clear")
	}
	tampered := k
	ct, _ := base64.StdEncoding.DecodeString(k.Sealed)
	ct[3] ^= 1
	tampered.Sealed = base64.StdEncoding.EncodeToString(ct)
	for _, tc := range []struct {
		name                 string
		priv                 bool
		edge, domain, finger string
		k                    manifest.SealedKey
		want                 error
	}{
		{"another edge", false, "edge-2", "example.com", fp, k, ErrOpen},
		{"another domain", false, "edge-1", "example.org", fp, k, ErrOpen},
		{"another certificate", false, "edge-1", "example.com", "bb" + fp[2:], k, ErrOpen},
		{"tampered", false, "edge-1", "example.com", fp, tampered, ErrOpen},
		{"another edge's key", true, "edge-1", "example.com", fp, k, ErrUnknownKey},
		{"bad enc", false, "edge-1", "example.com", fp, manifest.SealedKey{KeyID: k.KeyID, Enc: "!", Sealed: k.Sealed}, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := priv
			if tc.priv {
				p = other
			}
			_, err := Open(p, tc.edge, tc.domain, tc.finger, tc.k)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestInfoIsLengthPrefixed(t *testing.T) {
	if bytes.Equal(info("ab", "c", fp), info("a", "bc", fp)) {
		t.Fatal("two triples give one info")
	}
}

func TestKeyFiles(t *testing.T) {
	priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	data, err := EncodePrivate(priv)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodePrivate(data)
	if err != nil || !back.Equal(priv) {
		t.Fatalf("decode: %v", err)
	}
	pub, err := DecodePublic(EncodePublic(priv.PublicKey()))
	if err != nil || !pub.Equal(priv.PublicKey()) {
		t.Fatalf("decode public: %v", err)
	}
	if len(KeyID(pub)) != 64 {
		t.Fatal("key id is not hex SHA-256")
	}
	for _, bad := range []string{"", "AAAA", base64.StdEncoding.EncodeToString(make([]byte, 31))} {
		if _, err := DecodePublic(bad); err == nil {
			t.Errorf("DecodePublic(%q) took it", bad)
		}
	}
	if _, err := DecodePrivate(keyPEM); err == nil {
		t.Error("an Ed25519 key taken as an encryption key")
	}
}

func TestEntryValidateKey(t *testing.T) {
	priv, _ := GenerateKey()
	k, err := Seal(priv.PublicKey(), "edge-1", "example.com", fp, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	e := manifest.Entry{Domain: "example.com", Pool: "shared-a", Revision: 1, Size: 1, SHA256: fp,
		Signature: base64.StdEncoding.EncodeToString(make([]byte, 64)), Key: &k}
	if err := e.Validate(); err != nil {
		t.Fatalf("a good key refused: %v", err)
	}
	for name, mod := range map[string]func(*manifest.SealedKey){
		"key id":      func(k *manifest.SealedKey) { k.KeyID = "XY" },
		"enc":         func(k *manifest.SealedKey) { k.Enc = base64.StdEncoding.EncodeToString(make([]byte, 8)) },
		"sealed size": func(k *manifest.SealedKey) { k.Sealed = base64.StdEncoding.EncodeToString(make([]byte, 20<<10)) },
	} {
		bad := k
		mod(&bad)
		e.Key = &bad
		if err := e.Validate(); !errors.Is(err, manifest.ErrInvalid) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// The suite is RFC 9180's DHKEM(X25519, HKDF-SHA256) (0x0020),
// HKDF-SHA256 (0x0001), AES-256-GCM (0x0002).
func TestSuite(t *testing.T) {
	priv, _ := GenerateKey()
	pk, err := hpke.NewDHKEMPublicKey(priv.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if pk.KEM().ID() != 0x0020 || kdf.ID() != 0x0001 || aead.ID() != 0x0002 {
		t.Fatalf("suite %#x/%#x/%#x", pk.KEM().ID(), kdf.ID(), aead.ID())
	}
}

func BenchmarkSeal(b *testing.B) {
	priv, _ := GenerateKey()
	for b.Loop() {
		if _, err := Seal(priv.PublicKey(), "edge-1", "example.com", fp, keyPEM); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	priv, _ := GenerateKey()
	k, _ := Seal(priv.PublicKey(), "edge-1", "example.com", fp, keyPEM)
	for b.Loop() {
		if _, err := Open(priv, "edge-1", "example.com", fp, k); err != nil {
			b.Fatal(err)
		}
	}
}
