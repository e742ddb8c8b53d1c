package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"cellvisor/controlapi/adminapi"
)

// demoCertName is the certificate the sample domain names.
const demoCertName = "demo"

// demoCA makes the demo's own certificate authority and a certificate of
// it for the sample domain, and writes the CA's certificate where curl
// reads it (tls/ca.pem in the demo's directory). It answers the domain's
// chain and key in PEM; the key goes to the control API only.
func demoCA(root string) (caFile string, chain, key []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cellvisor demo CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return "", nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", nil, nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", nil, nil, err
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: demoHost}, DNSNames: []string{demoHost},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, leafKey.Public(), caKey)
	if err != nil {
		return "", nil, nil, err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		return "", nil, nil, err
	}
	dir := filepath.Join(root, "tls")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, nil, err
	}
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return "", nil, nil, err
	}
	return caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

// uploadDemoCert makes the demo CA and uploads the sample domain's
// certificate to the control API, as an operator would with
// cellvisor-control cert add.
func (e *env) uploadDemoCert(ctx context.Context) error {
	caFile, chain, key, err := demoCA(e.root)
	if err != nil {
		return fmt.Errorf("demo certificate: %w", err)
	}
	v, err := e.admin.PutCertificate(ctx, demoCertName, adminapi.CertificateRequest{Chain: string(chain), Key: string(key)})
	if err != nil {
		return fmt.Errorf("upload the demo certificate: %w", err)
	}
	e.caFile = caFile
	fmt.Fprintf(e.o.out, "$ cellvisor-control cert add %s --cert CHAIN.pem --key KEY.pem    # made by the demo CA (tls/ca.pem)\ncertificate %s for %s, fingerprint %.16s…, until %s\n",
		demoCertName, v.Name, strings.Join(v.Names, ", "), v.Fingerprint, v.NotAfter.Format("2006-01-02"))
	return nil
}

// getHTTPS fetches https://<demoHost>:<port><path> from cell-01's HTTPS
// port, verified against the demo CA, and answers the body and protocol.
func (e *env) getHTTPS(ctx context.Context, path string) (string, string, error) {
	pemData, err := os.ReadFile(e.caFile)
	if err != nil {
		return "", "", err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemData)
	addr := fmt.Sprintf("127.0.0.1:%d", e.spec.httpsBase)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:%d%s", demoHost, e.spec.httpsBase, path), nil)
	if err != nil {
		return "", "", err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("%s", resp.Status)
	}
	return string(b), resp.Proto, err
}
