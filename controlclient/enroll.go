package controlclient

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/internal/atomicfile"
	"cellvisor/tlsseal"
)

// Identity is what an enrolled edge knows about itself and its control
// plane: the identity file.
type Identity struct {
	EdgeID string `json:"edge_id"`
	// ControlPublicKey is the standard base64 Ed25519 public key that signs
	// this edge's artifacts, pinned at enrollment.
	ControlPublicKey string `json:"control_public_key"`
	// ControlURL is the edge-control API; empty for an edge fed by a spool.
	ControlURL string `json:"control_url,omitempty"`
	// Slots is the slot count the control plane created the edge with.
	Slots int `json:"slots,omitempty"`
	// Org is the edge's organization, as the control API answered at
	// enrollment; empty when enrolled with an older control API.
	Org        string    `json:"org,omitempty"`
	EnrolledAt time.Time `json:"enrolled_at,omitzero"`
}

// Pending files: an enrollment that did not finish keeps its key and CSR,
// so that a retry is an exact retry.
const (
	pendingKey = "pending-key.pem"
	pendingCSR = "pending-csr.pem"
)

// ErrEnrolled is returned when the edge is enrolled already.
var ErrEnrolled = errors.New("edge already enrolled")

// EnrollOptions say how to enroll.
type EnrollOptions struct {
	// URL is the edge-control API (https://…).
	URL string
	// Token is the one-time bootstrap token.
	Token string
	// CAFile, when set, is the only CA trusted for the control API, pinned
	// for every later connection; empty means the system's roots.
	CAFile string
	// Dir is the identity directory (key, certificate, CAs), made 0700.
	Dir string
	// IdentityFile is where the identity is written.
	IdentityFile string
	// Slots, when not zero, is this host's configured slot count, which
	// must be the edge's.
	Slots int
	// Replace enrolls again over an existing identity (after a rotation).
	Replace bool
	// HTTPClient overrides the client (tests); nil builds one.
	HTTPClient *http.Client
}

// Enroll generates a key (or reuses the pending one of an unfinished
// attempt), submits a CSR with the bootstrap token and persists the issued
// identity: key, certificate and CAs (0600, atomic writes), then the
// identity file. From then on the token is not needed.
func Enroll(ctx context.Context, o EnrollOptions) (Identity, error) {
	if _, err := os.Stat(o.IdentityFile); err == nil && !o.Replace {
		return Identity{}, fmt.Errorf("%w (%s); after an identity rotation pass --replace with the new token", ErrEnrolled, o.IdentityFile)
	}
	if !strings.HasPrefix(o.URL, "https://") {
		return Identity{}, fmt.Errorf("control URL %q: want https://host:port", o.URL)
	}
	if o.Token == "" {
		return Identity{}, errors.New("no bootstrap token")
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return Identity{}, fmt.Errorf("identity directory: %w", err)
	}
	if err := os.Chmod(o.Dir, 0o700); err != nil {
		return Identity{}, err
	}
	var serverCA []byte
	var roots *x509.CertPool
	if o.CAFile != "" {
		var err error
		if serverCA, err = os.ReadFile(o.CAFile); err != nil {
			return Identity{}, fmt.Errorf("CA file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(serverCA) {
			return Identity{}, fmt.Errorf("CA file %s: no PEM certificate", o.CAFile)
		}
	}
	key, csrPEM, err := pending(o.Dir, pendingKey, pendingCSR)
	if err != nil {
		return Identity{}, err
	}
	encKey, err := pendingEncryptionKey(o.Dir)
	if err != nil {
		return Identity{}, err
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}}}
	}
	body, _ := json.Marshal(edgeapi.EnrollRequest{Token: o.Token, CSR: string(csrPEM), EncryptionKey: tlsseal.EncodePublic(encKey.PublicKey())})
	resp, err := postEnroll(ctx, hc, strings.TrimRight(o.URL, "/")+edgeapi.PathEnroll, body)
	if err != nil {
		return Identity{}, fmt.Errorf("enroll: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Identity{}, fmt.Errorf("enroll: %w", readError(resp))
	}
	var er edgeapi.EnrollResponse
	// Lenient (edgeapi): a newer control API may add fields; what matters
	// is checked by checkIssued.
	if err := json.NewDecoder(io.LimitReader(resp.Body, edgeapi.MaxEnrollBytes)).Decode(&er); err != nil {
		return Identity{}, fmt.Errorf("enroll: decode answer: %w", err)
	}
	if err := checkIssued(er, key); err != nil {
		return Identity{}, fmt.Errorf("enroll: %w", err)
	}
	if o.Slots != 0 && er.Slots != o.Slots {
		return Identity{}, fmt.Errorf("enroll: the control plane created edge %s with %d slots, this host is configured for %d: fix slots in the configuration", er.EdgeID, er.Slots, o.Slots)
	}
	id := Identity{EdgeID: er.EdgeID, ControlPublicKey: er.ControlPublicKey, ControlURL: strings.TrimRight(o.URL, "/"), Slots: er.Slots, Org: er.Org, EnrolledAt: time.Now().UTC()}
	keyPEM, err := os.ReadFile(filepath.Join(o.Dir, pendingKey))
	if err != nil {
		return Identity{}, err
	}
	encPEM, err := os.ReadFile(filepath.Join(o.Dir, pendingEncKey))
	if err != nil {
		return Identity{}, err
	}
	files := []struct {
		name string
		data []byte
	}{{KeyFile, keyPEM}, {EncKeyFile, encPEM}, {CertFile, []byte(er.Certificate)}, {CAFile, []byte(er.CA)}}
	if serverCA != nil {
		files = append(files, struct {
			name string
			data []byte
		}{ServerCAFile, serverCA})
	} else if err := os.Remove(filepath.Join(o.Dir, ServerCAFile)); err != nil && !os.IsNotExist(err) {
		return Identity{}, err
	}
	for _, f := range files {
		if err := atomicfile.WriteFile(filepath.Join(o.Dir, f.name), f.data, 0o600); err != nil {
			return Identity{}, fmt.Errorf("persist identity: %w", err)
		}
	}
	data, _ := json.MarshalIndent(id, "", "  ")
	if err := atomicfile.WriteFile(o.IdentityFile, append(data, '\n'), 0o600); err != nil {
		return Identity{}, fmt.Errorf("persist identity: %w", err)
	}
	// A renewal of the identity this one replaces has no use any more.
	for _, f := range []string{pendingKey, pendingCSR, pendingEncKey, nextEncKey, prevEncKey, renewKey, renewCSR, renewCert} {
		os.Remove(filepath.Join(o.Dir, f))
	}
	return id, nil
}

// pending returns the unfinished attempt's key and CSR, from the files
// named keyName and csrName in dir, or makes them.
func pending(dir, keyName, csrName string) (crypto.Signer, []byte, error) {
	keyPath, csrPath := filepath.Join(dir, keyName), filepath.Join(dir, csrName)
	keyPEM, kerr := os.ReadFile(keyPath)
	csrPEM, cerr := os.ReadFile(csrPath)
	if kerr == nil && cerr == nil {
		b, _ := pem.Decode(keyPEM)
		if b != nil {
			if k, err := x509.ParsePKCS8PrivateKey(b.Bytes); err == nil {
				if s, ok := k.(crypto.Signer); ok {
					return s, csrPEM, nil
				}
			}
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "cellvisor edge"}}, key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	csrPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER})
	if err := atomicfile.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := atomicfile.WriteFile(csrPath, csrPEM, 0o600); err != nil {
		return nil, nil, err
	}
	return key, csrPEM, nil
}

// checkIssued checks the answer: a client certificate for our key, CN =
// the edge id, no IP SANs, issued by the CA given, and a signing key.
func checkIssued(er edgeapi.EnrollResponse, key crypto.Signer) error {
	if _, err := checkCert(er.Certificate, er.CA, er.EdgeID, key); err != nil {
		return err
	}
	if k, err := base64.StdEncoding.DecodeString(er.ControlPublicKey); err != nil || len(k) != 32 {
		return errors.New("control public key: want 32 bytes of base64")
	}
	return nil
}

// checkCert checks an issued client certificate: for key, CN = edgeID, no
// IP SANs, for client authentication, issued by the CA given.
func checkCert(certPEM, caPEM, edgeID string, key crypto.Signer) (*x509.Certificate, error) {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil {
		return nil, errors.New("certificate: not PEM")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	switch {
	case !ok || !pub.Equal(cert.PublicKey):
		return nil, errors.New("certificate is not for this edge's key")
	case cert.Subject.CommonName != edgeID || edgeID == "":
		return nil, fmt.Errorf("certificate CN %q, edge id %q", cert.Subject.CommonName, edgeID)
	case len(cert.IPAddresses) != 0:
		return nil, errors.New("certificate carries IP SANs")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, errors.New("CA: no PEM certificate")
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	return cert, nil
}
