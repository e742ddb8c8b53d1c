// Package outboundtest holds test doubles for the send path's tests (in
// outbound and in the agent's integration tests): a CA that issues
// certificates as the control plane's PKI does, and a fake control API
// speaking the egress part of the edge-control contract. Only tests import
// it.
package outboundtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// CA issues certificates as the control plane's PKI does: edges get
// CN = edge id, ClientAuth only, no SANs.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate.
	PEM []byte
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

var (
	serialMu sync.Mutex
	serialN  int64 = 100
)

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serialMu.Lock()
	serialN++
	tmpl.SerialNumber = big.NewInt(serialN)
	serialMu.Unlock()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, _ := x509.MarshalPKCS8PrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
}

// EdgeIdentity writes an edge's identity directory as enrollment does:
// cert.pem, key.pem, ca.pem (the edges' CA) and server-ca.pem.
func (ca *CA) EdgeIdentity(t testing.TB, edgeID string, serverCA []byte) string {
	t.Helper()
	dir := t.TempDir()
	c, k := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: edgeID, OrganizationalUnit: []string{"cellvisor edge"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	for name, data := range map[string][]byte{"cert.pem": c, "key.pem": k, "ca.pem": ca.PEM, "server-ca.pem": serverCA} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// ServerCert is a loopback server certificate (the control API's).
func (ca *CA) ServerCert(t testing.TB) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, &x509.Certificate{Subject: pkix.Name{CommonName: "control"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

// Pool is a pool of the CA's certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}
