package acmeissue

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/domain"
	"cellvisor/internal/pebbletest"
)

// testTimeout bounds one test's talk with Pebble.
const testTimeout = 2 * time.Minute

// bufLogger returns a logger writing JSON lines into a buffer.
func bufLogger() (*zap.Logger, *syncBuffer) {
	buf := new(syncBuffer)
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(buf), zap.DebugLevel)), buf
}

func newIssuer(t *testing.T, ca *pebbletest.CA, keys KeyStore, ch Challenges, log *zap.Logger) *Issuer {
	t.Helper()
	is, err := New(Options{DirectoryURL: ca.DirectoryURL, Email: "ops@example.com", Roots: ca.Roots, Keys: keys, Challenges: ch, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return is
}

// checkCert checks an issued certificate as a cell would use it: the key
// is the leaf's, the chain verifies up to Pebble's issuing root for every
// hostname, and the domain contract reads the chain.
func checkCert(t *testing.T, ctx context.Context, ca *pebbletest.CA, c *Certificate, hostnames []string) *x509.Certificate {
	t.Helper()
	leaf, err := ca.Verify(ctx, c.ChainPEM, c.KeyPEM, hostnames...)
	if err != nil {
		t.Fatalf("issued certificate: %v", err)
	}
	if !c.NotAfter.Equal(leaf.NotAfter) || !c.NotBefore.Equal(leaf.NotBefore) {
		t.Errorf("validity %v–%v, leaf says %v–%v", c.NotBefore, c.NotAfter, leaf.NotBefore, leaf.NotAfter)
	}
	if _, err := domain.ChainFingerprint(string(c.ChainPEM)); err != nil {
		t.Errorf("the domain contract refuses the chain: %v", err)
	}
	if b, _ := pem.Decode(c.KeyPEM); b == nil || b.Type != "PRIVATE KEY" {
		t.Errorf("key is not PKCS#8 PEM")
	}
	return leaf
}

func TestObtainPebble(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	hosts := []string{"shop.example.com", "www.shop.example.com"}
	r := newResponder(t)
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: r.port, Hostnames: hosts})
	keys := &memKeys{}
	log, logs := bufLogger()
	is := newIssuer(t, ca, keys, r, log)

	c, err := is.Obtain(ctx, "shop", hosts)
	if err != nil {
		t.Fatalf("obtain: %v\npebble:\n%s", err, ca.Output())
	}
	leaf := checkCert(t, ctx, ca, c, hosts)
	if got := leaf.NotAfter.Sub(leaf.NotBefore); got < 89*24*time.Hour || got > 91*24*time.Hour {
		t.Errorf("lifetime %v, want Pebble's 90 days", got)
	}
	presents, cleanups, pending, asked := r.counts()
	if presents != 1 || cleanups != 1 || pending != 0 {
		t.Errorf("presents %d cleanups %d pending %d, want one publish of all challenges, withdrawn after", presents, cleanups, pending)
	}
	for _, h := range hosts {
		if asked[h] == 0 {
			t.Errorf("the CA never asked the responder for %s (asked: %v)", h, asked)
		}
	}

	// A second order (a new Issuer, as after a restart) reuses the stored
	// account key: no second key is made.
	is2 := newIssuer(t, ca, keys, r, log)
	c2, err := is2.Obtain(ctx, "shop", hosts[:1])
	if err != nil {
		t.Fatalf("second obtain: %v", err)
	}
	checkCert(t, ctx, ca, c2, hosts[:1])
	if keys.puts != 1 {
		t.Errorf("account key stored %d times, want once", keys.puts)
	}
	if bytes.Equal(c.KeyPEM, c2.KeyPEM) {
		t.Error("two orders share a certificate key: each needs a fresh one")
	}
	for _, secret := range [][]byte{c.KeyPEM, c2.KeyPEM, keys.key} {
		blk, _ := pem.Decode(secret)
		if bytes.Contains(logs.Bytes(), secret) || strings.Contains(logs.String(), string(pemBody(blk))) {
			t.Fatal("a private key appears in the logs")
		}
	}
	if !strings.Contains(logs.String(), `"acme certificate issued"`) {
		t.Errorf("no issue log line:\n%s", logs.String())
	}
}

func TestObtainFailedValidationReportsProblem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r := newResponder(t)
	r.corrupt = true
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: r.port, Hostnames: []string{"bad.example.com"}})
	is := newIssuer(t, ca, &memKeys{}, r, nil)

	_, err := is.Obtain(ctx, "bad", []string{"bad.example.com"})
	if err == nil {
		t.Fatal("obtain with a wrong key authorization succeeded")
	}
	ps := Problems(err)
	if len(ps) == 0 {
		t.Fatalf("no ACME problem in %v", err)
	}
	if ps[0].Type != "urn:ietf:params:acme:error:unauthorized" || !strings.Contains(ps[0].Detail, "did not match") {
		t.Errorf("problem %+v, want Pebble's unauthorized: key authorization did not match", ps[0])
	}
	for _, want := range []string{"acme order for bad", "validate bad.example.com", "unauthorized"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, cleanups, pending, _ := r.counts(); cleanups != 1 || pending != 0 {
		t.Errorf("cleanups %d pending %d: a failed order must withdraw its challenges", cleanups, pending)
	}
}

func TestObtainUnresolvableHostname(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r := newResponder(t)
	ca := pebbletest.Start(t, pebbletest.Options{HTTPPort: r.port}) // its DNS knows no name
	is := newIssuer(t, ca, &memKeys{}, r, nil)
	_, err := is.Obtain(ctx, "ghost", []string{"ghost.example.com"})
	ps := Problems(err)
	if err == nil || len(ps) == 0 || ps[0].Type != "urn:ietf:params:acme:error:connection" || !strings.Contains(ps[0].Detail, "could not resolve") {
		t.Fatalf("err %v, problems %+v: want the CA's connection problem", err, ps)
	}
	t.Logf("reported: %v", err)
}

func TestNewRefusals(t *testing.T) {
	ok := Options{DirectoryURL: "https://ca.example/dir", Keys: &memKeys{}, Challenges: &responder{}}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"plain http", func(o *Options) { o.DirectoryURL = "http://ca.example/dir" }, "must be https://"},
		{"two emails", func(o *Options) { o.Email = "a@x.example, b@x.example" }, "one address"},
		{"no at", func(o *Options) { o.Email = "ops" }, "one address"},
		{"no keys", func(o *Options) { o.Keys = nil }, "required"},
		{"no challenges", func(o *Options) { o.Challenges = nil }, "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok
			tc.edit(&o)
			if _, err := New(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := New(ok); err != nil {
		t.Fatal(err)
	}
}

func pemBody(b *pem.Block) []byte {
	if b == nil {
		return []byte("\x00never")
	}
	return pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes})[len("-----BEGIN "+b.Type+"-----\n"):][:60]
}
