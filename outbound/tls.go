package outbound

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// PeerTLS is the edges' mutual TLS between each other, on their enrollment
// identities: an edge's certificate is issued by the control plane's CA
// with CN = the edge id, the ClientAuth extended key usage only and no IP
// SANs. The intake presents it as its server certificate and requires a
// client certificate from the same CA; a forwarder checks the intake's
// certificate against that CA for the ClientAuth usage and the holder's
// edge id as CN (VerifyConnection), since the standard server check (a
// ServerAuth usage, a name or IP SAN) cannot pass on these certificates:
// the PKI stays as it is. The certificate is read again when its file
// changes (a renewal).
type PeerTLS struct {
	certFile, keyFile string
	roots             *x509.CertPool

	mu   sync.Mutex // guards the following fields
	cert *tls.Certificate
	mod  time.Time
}

// NewPeerTLS loads the edge's certificate and key, and the CA that issued
// every edge's certificate (the enrollment's ca.pem).
func NewPeerTLS(certFile, keyFile, caFile string) (*PeerTLS, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("edge CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("edge CA %s: no PEM certificate", caFile)
	}
	p := &PeerTLS{certFile: certFile, keyFile: keyFile, roots: roots}
	if _, err := p.certificate(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PeerTLS) certificate() (*tls.Certificate, error) {
	st, err := os.Stat(p.certFile)
	if err != nil {
		return nil, fmt.Errorf("edge certificate: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cert != nil && st.ModTime().Equal(p.mod) {
		return p.cert, nil
	}
	c, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		if p.cert != nil {
			return p.cert, nil // a renewal half written: the previous pair still serves
		}
		return nil, fmt.Errorf("edge certificate: %w", err)
	}
	p.cert, p.mod = &c, st.ModTime()
	return p.cert, nil
}

// ServerConfig is the intake's: it presents the edge's certificate and
// requires a client certificate issued by the edges' CA (verified for the
// ClientAuth usage, Go's default for client certificates).
func (p *PeerTLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      p.roots,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.certificate() },
	}
}

// ClientConfig is a forwarder's to the holder edge's intake: the standard
// verification is replaced (InsecureSkipVerify) by VerifyConnection, which
// verifies the chain against the edges' CA for the ClientAuth usage and
// requires CN = holder.
func (p *PeerTLS) ClientConfig(holder string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		InsecureSkipVerify:   true, // verified by VerifyConnection below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs.PeerCertificates, p.roots, holder)
		},
	}
}

// verifyPeer checks an edge's certificate chain: issued by roots, valid
// now, for ClientAuth, naming edge as CN.
func verifyPeer(certs []*x509.Certificate, roots *x509.CertPool, edge string) error {
	if len(certs) == 0 {
		return errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("peer certificate: %w", err)
	}
	if cn := certs[0].Subject.CommonName; cn != edge {
		return fmt.Errorf("peer certificate names edge %q, want the holder %q", cn, edge)
	}
	return nil
}
