package testcert

import (
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"
	"time"
)

// CA is one test root that issues many leaves (New makes a root per
// chain): for tests whose clients trust one root for every name served.
type CA struct {
	Cert *x509.Certificate
	key  crypto.Signer
	// PEM is the root certificate in PEM.
	PEM []byte
}

// NewCA makes a test root (ECDSA P-256, valid from an hour ago for a day).
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t, "")
	now := time.Now()
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "cellvisor test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	cert, pemData := create(t, tmpl, tmpl, key.Public(), key)
	return &CA{Cert: cert, key: key, PEM: pemData}
}

// Pool is a cert pool of the root alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a leaf for names (ECDSA P-256, valid until notAfter, or a
// day where zero) and answers its chain (the leaf alone: the root is the
// client's) and its PKCS#8 key, both PEM.
func (ca *CA) Issue(t testing.TB, notAfter time.Time, names ...string) (chainPEM, keyPEM string) {
	t.Helper()
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	key := newKey(t, "")
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	_, leaf := create(t, tmpl, ca.Cert, key.Public(), ca.key)
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(leaf), string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}))
}
