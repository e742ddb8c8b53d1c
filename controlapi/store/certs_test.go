package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

func testCert(name, fp string) Certificate {
	return Certificate{Name: name, Fingerprint: fp, Chain: "CHAIN-" + fp, Names: []string{"x.example", "*.x.example"}, Issuer: "CN=test",
		KeyType: "ecdsa-p256", NotBefore: time.UnixMilli(1_700_000_000_000).UTC(), NotAfter: time.UnixMilli(1_900_000_000_000).UTC()}
}

// fakeSealer seals nothing: it records what it was asked and names the
// key id it was given, so that entries show which edge key and which
// certificate key they carry.
func fakeSealer(edgeID, domain, fp, enc, atRest string) (*manifest.SealedKey, error) {
	return &manifest.SealedKey{KeyID: enc, Enc: edgeID + "|" + domain + "|" + fp, Sealed: atRest}, nil
}

func tlsArtifact(cert, fp string, n int) Builder {
	return bytes(fmt.Appendf(nil, `{"n":%d,"tls":{"certificate":%q,"fingerprint":%q}}`, n, cert, fp))
}

func TestCertificates(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		s.SealKey = fakeSealer
		c := testCert("x-cert", "fp1")
		if used, err := s.PutCertificate(ctx(t), c, "AT-REST-1", false); err != nil || len(used) != 0 {
			t.Fatalf("put: %v, %v", used, err)
		}
		if _, err := s.PutCertificate(ctx(t), testCert("x-cert", "fp2"), "AT-REST-2", false); !errors.Is(err, ErrConflict) {
			t.Fatalf("second put without replace: %v, want ErrConflict", err)
		}
		got, err := s.Certificate(ctx(t), "x-cert")
		if err != nil || got.Fingerprint != "fp1" || got.Chain != c.Chain || len(got.Names) != 2 || !got.NotAfter.Equal(c.NotAfter) {
			t.Fatalf("certificate %+v, %v", got, err)
		}

		e := newEdge(t, s, "fra-1")
		if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, tlsArtifact("x-cert", "fp1", 1)); err != nil {
			t.Fatal(err)
		}
		mustEdge(t, s, e.ID)
		entry := func() manifest.Entry {
			t.Helper()
			es, err := s.Entries(ctx(t), e.ID, mustSeq(t, s, e.ID), "", 10)
			if err != nil || len(es) != 1 {
				t.Fatalf("entries %+v, %v", es, err)
			}
			if !signedFor(e.ID, es[0]) {
				t.Fatal("entry not signed with its key")
			}
			return es[0]
		}
		if k := entry().Key; k != nil {
			t.Fatalf("an edge with no encryption key got a key: %+v", k)
		}
		seq, advanced, err := s.SetEncryptionKey(ctx(t), e.ID, "EDGEKEY1", fakeSign)
		if err != nil || !advanced || seq.Sequence != mustSeq(t, s, e.ID) {
			t.Fatalf("set encryption key: %+v %v %v", seq, advanced, err)
		}
		if k := entry().Key; k == nil || k.KeyID != "EDGEKEY1" || k.Enc != e.ID+"|x.example|fp1" || k.Sealed != "AT-REST-1" {
			t.Fatalf("entry key %+v", k)
		}
		if _, advanced, err := s.SetEncryptionKey(ctx(t), e.ID, "EDGEKEY1", fakeSign); err != nil || advanced {
			t.Fatalf("same key again: advanced %v, %v", advanced, err)
		}

		if err := s.DeleteCertificate(ctx(t), "x-cert"); !errors.Is(err, ErrConflict) {
			t.Fatalf("delete while used: %v, want ErrConflict", err)
		}
		used, err := s.PutCertificate(ctx(t), testCert("x-cert", "fp2"), "AT-REST-2", true)
		if err != nil || len(used) != 1 || used[0] != "x.example" {
			t.Fatalf("replace: used %v, %v", used, err)
		}
		if _, err := s.PublishDomain(ctx(t), "x.example", "shared-default", nil, tlsArtifact("x-cert", "fp2", 2)); err != nil {
			t.Fatal(err)
		}
		mustEdge(t, s, e.ID)
		if k := entry().Key; k == nil || k.Enc != e.ID+"|x.example|fp2" || k.Sealed != "AT-REST-2" {
			t.Fatalf("entry key after the replacement %+v", k)
		}
		// A rollback to revision 1 seals the key revision 1's certificate
		// had, kept by its fingerprint.
		if _, err := s.RollbackDomain(ctx(t), "x.example", 1, nil); err != nil {
			t.Fatal(err)
		}
		mustEdge(t, s, e.ID)
		if k := entry().Key; k == nil || k.Sealed != "AT-REST-1" {
			t.Fatalf("entry key after the rollback %+v", k)
		}
		list, err := s.Certificates(ctx(t))
		if err != nil || len(list) != 1 || len(list[0].UsedBy) != 1 {
			t.Fatalf("list %+v, %v", list, err)
		}
		if _, err := s.DeleteDomain(ctx(t), "x.example"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteCertificate(ctx(t), "x-cert"); err != nil {
			t.Fatalf("delete unused: %v", err)
		}
		if _, err := s.Certificate(ctx(t), "x-cert"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
		var n int
		if err := s.db.QueryRowContext(ctx(t), `SELECT COUNT(*) FROM certificate_keys WHERE fingerprint = 'fp2'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the deleted certificate's key stays: %d, %v", n, err)
		}
	})
}

func mustSeq(t *testing.T, s *Store, id string) int64 {
	t.Helper()
	e, err := s.Edge(ctx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return e.Sequence
}

func TestEncKeyIDIsTLSSealKeyID(t *testing.T) {
	k, err := tlsseal.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if encKeyID(tlsseal.EncodePublic(k.PublicKey())) != tlsseal.KeyID(k.PublicKey()) {
		t.Fatal("the store names keys otherwise than tlsseal")
	}
}
