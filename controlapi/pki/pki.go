// Package pki owns the control plane's key material: the key file that
// seals secrets at rest (AES-256-GCM), the certificate authority that
// issues edges' client certificates (CN = edge UUID, no IP SANs) and the
// control API's server certificate, and CSR checks. Only controlapi imports
// it.
package pki

import (
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrCSR marks a certificate signing request that is refused.
var ErrCSR = errors.New("invalid certificate signing request")

// Validity periods.
const (
	CAValidity     = 10 * 365 * 24 * time.Hour
	ClientValidity = 365 * 24 * time.Hour
	ServerValidity = 365 * 24 * time.Hour
)

// KeyFile reads the 32-byte sealing key from path (64 hex digits), creating
// it (0600, in a 0700 directory) when absent. A key file others can read is
// refused.
func KeyFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("key file: %w", err)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("key file: %w", err)
		}
		_, werr := f.WriteString(hex.EncodeToString(key) + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			return nil, fmt.Errorf("key file %s: %w", path, err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key file %s: mode %04o lets others read it; chmod 600", path, st.Mode().Perm())
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("key file %s: want 64 hex digits", path)
	}
	return key, nil
}

// Seal encrypts plaintext with key, bound to label (a secret sealed as one
// thing cannot be opened as another), as base64 of nonce || ciphertext.
func Seal(key []byte, label string, plaintext []byte) (string, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(gcm.Seal(nonce, nonce, plaintext, []byte(label))), nil
}

// Open decrypts what Seal sealed under the same key and label.
func Open(key []byte, label, sealed string) ([]byte, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	data, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil || len(data) < gcm.NonceSize() {
		return nil, fmt.Errorf("open sealed %s: malformed", label)
	}
	out, err := gcm.Open(nil, data[:gcm.NonceSize()], data[gcm.NonceSize():], []byte(label))
	if err != nil {
		return nil, fmt.Errorf("open sealed %s: wrong key file or damaged secret", label)
	}
	return out, nil
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// CA is the control plane's certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is Cert, PEM-encoded.
	PEM string
}

// NewCA creates a self-signed ECDSA P-256 CA. It returns the CA and its key
// as PKCS #8 DER, for sealing.
func NewCA(now time.Time) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "cellvisor control CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := LoadCA(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), keyDER)
	return ca, keyDER, err
}

// LoadCA loads a CA from its PEM certificate and PKCS #8 DER key.
func LoadCA(certPEM string, keyDER []byte) (*CA, error) {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("CA certificate: not PEM")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("CA key: not a signing key")
	}
	return &CA{Cert: cert, Key: signer, PEM: certPEM}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

// SerialHex is how serials are stored and compared.
func SerialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// ParseCSR decodes a PEM CSR and checks its self-signature and key: ECDSA
// P-256/P-384 or Ed25519. Its subject and extensions are ignored: the
// certificate's identity comes from the control plane alone.
func ParseCSR(csrPEM string) (*x509.CertificateRequest, error) {
	b, _ := pem.Decode([]byte(csrPEM))
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: not a PEM CERTIFICATE REQUEST", ErrCSR)
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrCSR, err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("%w: ECDSA curve %s; use P-256 or P-384", ErrCSR, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("%w: key type %T; use ECDSA P-256 or Ed25519", ErrCSR, k)
	}
	return csr, nil
}

// IssueClient issues an edge's client certificate: CN = edgeID, no SANs,
// client authentication only, valid ClientValidity.
func (ca *CA) IssueClient(csr *x509.CertificateRequest, edgeID string, now time.Time) (*x509.Certificate, string, error) {
	return ca.IssueClientFor(csr, edgeID, now, ClientValidity)
}

// IssueClientFor is IssueClient for a certificate valid for validity. Its
// start is backdated by a tenth of that, at most 5 minutes, for clocks
// behind the control plane's.
func (ca *CA) IssueClientFor(csr *x509.CertificateRequest, edgeID string, now time.Time, validity time.Duration) (*x509.Certificate, string, error) {
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: edgeID, OrganizationalUnit: []string{"cellvisor edge"}},
		NotBefore:    now.Add(-min(5*time.Minute, validity/10)),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return ca.issue(tmpl, csr.PublicKey)
}

// IssueServer issues a server certificate for hosts (DNS names or IPs).
func (ca *CA) IssueServer(hosts []string, pub crypto.PublicKey, now time.Time) (*x509.Certificate, string, error) {
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "cellvisor control"},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(ServerValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl, pub)
}

func (ca *CA) issue(tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, string, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, "", fmt.Errorf("issue certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, "", err
	}
	return cert, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), nil
}
