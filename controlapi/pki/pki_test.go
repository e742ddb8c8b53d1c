package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "seal.key")
	k1, err := KeyFile(path)
	if err != nil || len(k1) != 32 {
		t.Fatalf("create: %d bytes, %v", len(k1), err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %04o", st.Mode().Perm())
	}
	k2, err := KeyFile(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload: %v", err)
	}
	os.Chmod(path, 0o644)
	if _, err := KeyFile(path); err == nil {
		t.Fatal("a world-readable key file was accepted")
	}
	os.Chmod(path, 0o600)
	os.WriteFile(path, []byte("not hex\n"), 0o600)
	if _, err := KeyFile(path); err == nil {
		t.Fatal("a malformed key file was accepted")
	}
}

func TestSealOpen(t *testing.T) {
	key, other := make([]byte, 32), make([]byte, 32)
	rand.Read(key)
	rand.Read(other)
	secret := []byte("the CA's private key")
	sealed, err := Seal(key, "ca-key", secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains([]byte(sealed), secret) {
		t.Fatal("sealed text contains the secret")
	}
	if got, err := Open(key, "ca-key", sealed); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("open: %q, %v", got, err)
	}
	if _, err := Open(other, "ca-key", sealed); err == nil {
		t.Fatal("opened with another key")
	}
	if _, err := Open(key, "signing-key", sealed); err == nil {
		t.Fatal("opened under another label")
	}
	if again, _ := Seal(key, "ca-key", secret); again == sealed {
		t.Fatal("two seals of one secret are equal: nonce reused")
	}
}

func csrPEM(t *testing.T, key any, cn string) string {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn},
		DNSNames: []string{"evil.example"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

func TestIssueClientIgnoresWhatTheCSRAsksFor(t *testing.T) {
	now := time.Now()
	ca, keyDER, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := LoadCA(ca.PEM, keyDER); err != nil || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("reload CA: %v", err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, err := ParseCSR(csrPEM(t, key, "someone-else"))
	if err != nil {
		t.Fatal(err)
	}
	cert, _, err := ca.IssueClient(csr, "3f1b3c1e-0000-4000-8000-000000000001", now)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "3f1b3c1e-0000-4000-8000-000000000001" || len(cert.DNSNames)+len(cert.IPAddresses)+len(cert.URIs) != 0 {
		t.Fatalf("CN %q SANs %v %v %v", cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses, cert.URIs)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify as a client certificate: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("a client certificate verifies as a server's")
	}
}

func TestParseCSRRefusals(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	good, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tampered := []byte(csrPEM(t, good, "x"))
	b, _ := pem.Decode(tampered)
	b.Bytes[len(b.Bytes)-5] ^= 0xff
	for name, in := range map[string]string{
		"not PEM":     "hello",
		"certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})),
		"RSA key":     csrPEM(t, rsaKey, "x"),
		"P-224 key":   csrPEM(t, p224, "x"),
		"tampered":    string(pem.EncodeToMemory(b)),
	} {
		if _, err := ParseCSR(in); !errors.Is(err, ErrCSR) {
			t.Errorf("%s: %v, want ErrCSR", name, err)
		}
	}
}
