package activation

import (
	"bytes"
	"context"
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/domain"
	"cellvisor/internal/testcert"
	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

const tlsDomain = "tls.example.com"

// tlsArtifact is tlsDomain's artifact at rev, carrying chain.
func tlsArtifact(t *testing.T, rev int64, chain []byte) ([]byte, string) {
	t.Helper()
	fp, err := domain.ChainFingerprint(string(chain))
	if err != nil {
		t.Fatal(err)
	}
	art, _ := json.Marshal(map[string]any{"domain": tlsDomain, "pool": domain.PoolSharedDefault, "revision": rev,
		"hostnames": []string{tlsDomain}, "routes": []any{map[string]any{"prefix": "/", "respond": map[string]any{"status": 200}}},
		"tls": map[string]any{"certificate": "c", "chain": string(chain), "fingerprint": fp}})
	return art, fp
}

// publishTLS serves seq with tlsDomain carrying c's chain and seal as its
// key (seal sets the key sealed to the edge; it may tamper with it).
func (r *rig) publishTLS(t *testing.T, seq int64, c testcert.Chain, seal func(fp string) manifest.SealedKey) {
	t.Helper()
	art, fp := tlsArtifact(t, seq, c.PEM())
	e := manifest.NewEntry(r.priv, edge, tlsDomain, domain.PoolSharedDefault, seq, art)
	k := seal(fp)
	e.Key = &k
	e = resign(r.priv, e)
	r.src.artifacts[e.SHA256] = art
	r.src.mu.Lock()
	r.src.m = manifest.Manifest{EdgeID: edge, Sequence: seq, Entries: []manifest.Entry{e}}
	r.src.mu.Unlock()
}

func mustSeal(t *testing.T, pub *ecdh.PublicKey, edgeID, dom, fp string, key []byte) manifest.SealedKey {
	t.Helper()
	k, err := tlsseal.Seal(pub, edgeID, dom, fp, key)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// keyedRig is a rig whose edge has an encryption key, logging into logs.
func keyedRig(t *testing.T, logs *bytes.Buffer) (*rig, *ecdh.PrivateKey) {
	r := newRig(t)
	k, err := tlsseal.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	r.a.o.EncryptionKeys = func() ([]*ecdh.PrivateKey, error) { return []*ecdh.PrivateKey{k}, nil }
	r.a.log = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(logs), zap.DebugLevel))
	return r, k
}

func TestSealedKeyOpensIntoThePoolRuntime(t *testing.T) {
	var logs bytes.Buffer
	r, k := keyedRig(t, &logs)
	c := testcert.New(t, testcert.Options{Names: []string{tlsDomain}})
	r.publishTLS(t, 1, c, func(fp string) manifest.SealedKey { return mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key) })
	if got := r.verifiedKey(t); !bytes.Equal(got, c.Key) {
		t.Fatalf("pool runtime key %q, want the certificate's", got)
	}
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := r.lastAck(); a.Status != manifest.AckApplied || r.a.Active() != 1 {
		t.Fatalf("ack %+v, active %d", a, r.a.Active())
	}
	body := strings.Split(string(c.Key), "\n")[1]
	if strings.Contains(r.poolJSON("cell-01"), body) || strings.Contains(logs.String(), body) {
		t.Fatal("the opened key is in the pool's JSON or the agent's log")
	}
	if !strings.Contains(r.poolJSON("cell-01"), tlsDomain) {
		t.Fatalf("pool JSON %q lacks the domain", r.poolJSON("cell-01"))
	}
}

// verifiedKey collects the source's manifest, verifies it (nothing is
// activated) and returns the key its pool runtimes carry for tlsDomain,
// nil for none.
func (r *rig) verifiedKey(t *testing.T) []byte {
	t.Helper()
	m, err := manifest.Collect(context.Background(), r.src.Page, edge, 0)
	if err != nil {
		t.Fatal(err)
	}
	pl, done, err := r.a.verify(context.Background(), m, r.src.Artifact)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for _, p := range pl.slots {
		if p != nil && p.Keys[tlsDomain] != nil {
			return p.Keys[tlsDomain]
		}
	}
	return nil
}

// A manifest that carries the seals the last one did takes their keys as
// they are: none is opened again; a new seal is.
func TestSealsOpenedOnce(t *testing.T) {
	var logs bytes.Buffer
	r, k := keyedRig(t, &logs)
	c := testcert.New(t, testcert.Options{Names: []string{tlsDomain}})
	var seal manifest.SealedKey
	r.publishTLS(t, 1, c, func(fp string) manifest.SealedKey {
		seal = mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key)
		return seal
	})
	verify := func() []byte { t.Helper(); return r.verifiedKey(t) }
	if got := verify(); !bytes.Equal(got, c.Key) || r.a.opens.Load() != 1 {
		t.Fatalf("first: key %v, %d opened", got != nil, r.a.opens.Load())
	}
	if got := verify(); !bytes.Equal(got, c.Key) || r.a.opens.Load() != 1 {
		t.Fatalf("the same seal again: key %v, %d opened in all, want 1", got != nil, r.a.opens.Load())
	}
	// The same key sealed anew (another blob): opened.
	r.publishTLS(t, 1, c, func(fp string) manifest.SealedKey { return mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key) })
	if got := verify(); !bytes.Equal(got, c.Key) || r.a.opens.Load() != 2 {
		t.Fatalf("a new seal: key %v, %d opened in all, want 2", got != nil, r.a.opens.Load())
	}
}

// A tampered seal, a seal for another edge, domain or encryption key, or
// a key that is not the leaf's refuses the manifest with its reason:
// nothing is activated.
func TestBadSealsRefuseTheManifest(t *testing.T) {
	other, _ := tlsseal.GenerateKey()
	c := testcert.New(t, testcert.Options{Names: []string{tlsDomain}})
	wrong := testcert.New(t, testcert.Options{Names: []string{tlsDomain}})
	for _, tc := range []struct {
		name   string
		seal   func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey
		noKey  bool
		reason string
	}{
		{"tampered", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			s := mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key)
			ct, _ := base64.StdEncoding.DecodeString(s.Sealed)
			ct[len(ct)/2] ^= 0x40
			s.Sealed = base64.StdEncoding.EncodeToString(ct)
			return s
		}, false, "does not open"},
		{"for another edge", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			return mustSeal(t, k.PublicKey(), "edge-2", tlsDomain, fp, c.Key)
		}, false, "does not open"},
		{"for another domain", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			return mustSeal(t, k.PublicKey(), edge, "other.example.com", fp, c.Key)
		}, false, "does not open"},
		{"to an unknown key", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			return mustSeal(t, other.PublicKey(), edge, tlsDomain, fp, c.Key)
		}, false, "unknown encryption key"},
		{"no encryption key on the edge", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			return mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key)
		}, true, "no encryption key on this edge"},
		{"not the leaf's key", func(t *testing.T, k *ecdh.PrivateKey, fp string) manifest.SealedKey {
			return mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, wrong.Key)
		}, false, "not the certificate's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			r, k := keyedRig(t, &logs)
			r.publishTLS(t, 1, c, func(fp string) manifest.SealedKey { return mustSeal(t, k.PublicKey(), edge, tlsDomain, fp, c.Key) })
			if err := r.a.Poll(context.Background()); err != nil {
				t.Fatal(err)
			}
			before := r.poolJSON("cell-01")
			r.cells.reloads = nil
			r.publishTLS(t, 2, c, func(fp string) manifest.SealedKey { return tc.seal(t, k, fp) })
			if tc.noKey {
				r.a.o.EncryptionKeys = nil
			}
			if err := r.a.Poll(context.Background()); err != nil {
				t.Fatalf("a refusal is not an error to retry: %v", err)
			}
			a := r.lastAck()
			if a.Status != manifest.AckRefused || !strings.Contains(a.Reason, tc.reason) {
				t.Fatalf("ack %+v, want refused with %q", a, tc.reason)
			}
			if r.a.Active() != 1 || r.poolJSON("cell-01") != before || len(r.cells.reloads) != 0 {
				t.Fatalf("active %d, reloads %v: the previous release must stay", r.a.Active(), r.cells.reloads)
			}
			for _, key := range [][]byte{c.Key, wrong.Key} {
				if body := strings.Split(string(key), "\n")[1]; strings.Contains(logs.String(), body) || strings.Contains(a.Reason, body) {
					t.Fatal("a key in the log or the refusal")
				}
			}
		})
	}
}
