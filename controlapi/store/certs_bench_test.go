package store

import (
	"fmt"
	"path/filepath"
	"testing"

	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

// BenchmarkBuildSealed is one edge's poll-time build of a new revision of
// a domain with a certificate: its key sealed to the edge with HPKE (as
// the control API does, but for the key's decryption at rest) or, for the
// baseline, the same domain to an edge with no encryption key.
func BenchmarkBuildSealed(b *testing.B) {
	keyPEM := make([]byte, 241) // an ECDSA P-256 PKCS #8 key's PEM size
	for _, sealed := range []bool{false, true} {
		b.Run(fmt.Sprintf("sealed=%v", sealed), func(b *testing.B) {
			s, err := Open(b.Context(), filepath.Join(b.TempDir(), "control.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.InitSetting(b.Context(), SigningKeySetting, "test-key"); err != nil {
				b.Fatal(err)
			}
			s.SealKey = func(edgeID, dom, fp, enc, _ string) (*manifest.SealedKey, error) {
				pub, err := tlsseal.DecodePublic(enc)
				if err != nil {
					return nil, err
				}
				k, err := tlsseal.Seal(pub, edgeID, dom, fp, keyPEM)
				return &k, err
			}
			e, err := s.CreateEdge(b.Context(), NewEdge{ID: "id-e", Name: "e", Org: "acme", Country: "DE", Continent: "EU", Slots: 2, TokenHash: "tok",
				Assignments: map[string]string{"cell-01": "shared-default"}}, fakeSign)
			if err != nil {
				b.Fatal(err)
			}
			if sealed {
				k, _ := tlsseal.GenerateKey()
				if _, _, err := s.SetEncryptionKey(b.Context(), e.ID, tlsseal.EncodePublic(k.PublicKey()), fakeSign); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := s.PutCertificate(b.Context(), testCert("x-cert", "fp1"), "AT-REST", false); err != nil {
				b.Fatal(err)
			}
			n := 0
			for b.Loop() {
				b.StopTimer()
				n++
				if _, err := s.PublishDomain(b.Context(), "x.example", "shared-default", nil, tlsArtifact("x-cert", "fp1", n)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if built, err := s.Build(b.Context(), e.ID, fakeSign); err != nil || !built.Advanced {
					b.Fatalf("build: %+v, %v", built, err)
				}
			}
		})
	}
}
