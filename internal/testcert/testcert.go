// Package testcert makes real X.509 certificate chains and keys for the
// tests of HTTPS certificates: a root, an intermediate and a leaf for
// given names, key type and validity (New), or one root that issues many
// leaves (NewCA). Only tests import it.
package testcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sync/atomic"
	"testing"
	"time"
)

// Options shape a leaf; zero values mean ECDSA P-256, valid from an hour
// ago for 90 days.
type Options struct {
	Names     []string
	Key       string // "rsa-1024", "rsa-2048", "ecdsa-p256", "ecdsa-p384", "ecdsa-p521", "ed25519"
	NotBefore time.Time
	NotAfter  time.Time
}

// Chain is a leaf, its intermediate and root, and the leaf's key, in PEM.
type Chain struct {
	Leaf, Intermediate, Root []byte
	Key                      []byte
}

// PEM is the chain as served: leaf then intermediate.
func (c Chain) PEM() []byte { return append(append([]byte{}, c.Leaf...), c.Intermediate...) }

var serial atomic.Int64

func newKey(t testing.TB, kind string) crypto.Signer {
	t.Helper()
	var k crypto.Signer
	var err error
	switch kind {
	case "", "ecdsa-p256":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ecdsa-p384":
		k, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ecdsa-p521":
		k, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "rsa-1024":
		k, err = rsa.GenerateKey(rand.Reader, 1024)
	case "rsa-2048":
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ed25519":
		_, k, err = ed25519.GenerateKey(rand.Reader)
	default:
		t.Fatalf("testcert: key %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func create(t testing.TB, tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) (*x509.Certificate, []byte) {
	t.Helper()
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// New makes a chain.
func New(t testing.TB, o Options) Chain {
	t.Helper()
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(90 * 24 * time.Hour)
	}
	if o.Names == nil {
		o.Names = []string{"example.com"}
	}
	rootKey := newKey(t, "")
	caTmpl := func(cn string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, NotBefore: now.Add(-24 * time.Hour), NotAfter: now.Add(5 * 365 * 24 * time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	}
	rt := caTmpl("test root")
	root, rootPEM := create(t, rt, rt, rootKey.Public(), rootKey)
	intKey := newKey(t, "")
	inter, intPEM := create(t, caTmpl("test intermediate"), root, intKey.Public(), rootKey)
	leafKey := newKey(t, o.Key)
	_, leafPEM := create(t, &x509.Certificate{Subject: pkix.Name{CommonName: o.Names[0]}, DNSNames: o.Names,
		NotBefore: o.NotBefore, NotAfter: o.NotAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, inter, leafKey.Public(), intKey)
	der, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	return Chain{Leaf: leafPEM, Intermediate: intPEM, Root: rootPEM, Key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}
}
