// Package pebbletest runs Pebble, Let's Encrypt's test ACME CA, for tests:
// built from the module's Go tool (go.mod's tool directive), on loopback
// ports, behind a TLS certificate and a DNS server made by the test, with
// its HTTP-01 validation sent to a port the test names. Only tests import
// it.
package pebbletest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options say what the CA validates against and what it issues.
type Options struct {
	// HTTPPort is the port on 127.0.0.1 that HTTP-01 validations connect
	// to (a cell's HTTP port, or the test's own server). Required.
	HTTPPort int
	// Hostnames are the names the CA's DNS server answers with 127.0.0.1;
	// any other name is NXDOMAIN.
	Hostnames []string
	// Validity is the lifetime of the certificates issued, or zero for
	// Pebble's 90 days. Pebble counts it in whole seconds.
	Validity time.Duration
}

// CA is a running Pebble.
type CA struct {
	// DirectoryURL is the ACME directory, on 127.0.0.1.
	DirectoryURL string
	// Roots trusts the directory's TLS certificate (made by the test; not
	// the CA that issues).
	Roots *x509.CertPool
	// RootsPEM is Roots in PEM, for a CA file.
	RootsPEM []byte
	// DNSAddr is the DNS server the CA resolves hostnames with.
	DNSAddr string
	// PID is Pebble's process id.
	PID int

	mgmt   string // management interface host:port
	client *http.Client
	out    *bytes.Buffer // Pebble's output (guarded by outMu)
	outMu  *sync.Mutex
}

// startTimeout bounds building Pebble (the first time: compiled into the
// Go build cache) and waiting for it to answer.
const startTimeout = 3 * time.Minute

// Start builds and starts Pebble for this test and stops it (by its PID)
// when the test ends. Pebble's random nonce rejections, authorization reuse
// and validation sleeps are off, so a test sees one validation per order.
func Start(t testing.TB, o Options) *CA {
	t.Helper()
	if o.HTTPPort <= 0 {
		t.Fatal("pebbletest: HTTPPort is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	bin, err := Binary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	roots, rootsPEM := writeServerCert(t, dir)
	dnsAddr := StartDNS(t, o.Hostnames)
	ca := &CA{
		Roots:    roots,
		RootsPEM: rootsPEM,
		DNSAddr:  dnsAddr,
		client:   &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: 10 * time.Second},
		out:      new(bytes.Buffer),
		outMu:    new(sync.Mutex),
	}
	t.Cleanup(ca.client.CloseIdleConnections)
	// The ports are free when chosen; another test may take one before
	// Pebble binds it, so a Pebble that exits at once is tried again.
	for try := 1; ; try++ {
		err := ca.start(ctx, t, bin, dir, o)
		if err == nil {
			return ca
		}
		if try == 3 || ctx.Err() != nil {
			t.Fatalf("pebbletest: %v\npebble's output:\n%s", err, ca.Output())
		}
		t.Logf("pebbletest: %v; trying other ports", err)
	}
}

// freePorts returns n ports on 127.0.0.1 that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (ca *CA) start(ctx context.Context, t testing.TB, bin, dir string, o Options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	ca.mgmt = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	validity := int64(o.Validity / time.Second)
	if validity == 0 {
		validity = 90 * 86400
	}
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress":           listen,
		"managementListenAddress": ca.mgmt,
		"certificate":             filepath.Join(dir, "cert.pem"),
		"privateKey":              filepath.Join(dir, "key.pem"),
		"httpPort":                o.HTTPPort,
		"tlsPort":                 ports[2],
		"keyAlgorithm":            "ecdsa",
		"retryAfter":              map[string]int{"authz": 1, "order": 1},
		"profiles": map[string]any{
			"default": map[string]any{"description": "test", "validityPeriod": validity},
		},
	}}
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(bin, "-config", cfgPath, "-dnsserver", ca.DNSAddr)
	cmd.Env = append(os.Environ(),
		"PEBBLE_VA_NOSLEEP=1",
		"PEBBLE_WFE_NONCEREJECT=0",
		"PEBBLE_AUTHZREUSE=0",
	)
	cmd.Stdout = lockedWriter{ca.outMu, ca.out}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pebble: %w", err)
	}
	ca.PID = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL) // by PID: this test's own child
		<-exited
	}
	ca.DirectoryURL = "https://" + listen + "/dir"
	if err := ca.awaitReady(ctx, exited); err != nil {
		stop()
		return err
	}
	t.Cleanup(stop)
	return nil
}

// awaitReady polls the directory until it answers, Pebble exits or ctx ends.
func (ca *CA) awaitReady(ctx context.Context, exited <-chan struct{}) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := ca.client.Get(ca.DirectoryURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("pebble exited before it served its directory")
		case <-ctx.Done():
			return fmt.Errorf("pebble's directory %s did not answer: %w (last: %v)", ca.DirectoryURL, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// IssuerRoot returns the root of the certificates Pebble issues (a new one
// at every start), from its management interface.
func (ca *CA) IssuerRoot(ctx context.Context) (*x509.Certificate, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+ca.mgmt+"/roots/0", nil)
	if err != nil {
		return nil, err
	}
	resp, err := ca.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pebble root: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("pebble root: %s: %v", resp.Status, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("pebble root: not PEM")
	}
	return x509.ParseCertificate(blk.Bytes)
}

// Output returns what Pebble printed so far.
func (ca *CA) Output() string {
	ca.outMu.Lock()
	defer ca.outMu.Unlock()
	return ca.out.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// Binary builds Pebble (go.mod's tool, into the Go build cache, once per
// test binary) and returns its path.
func Binary(ctx context.Context) (string, error) {
	binOnce.Do(func() {
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(ctx, "go", "tool", "-n", "pebble")
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			binErr = fmt.Errorf("pebbletest: go tool -n pebble (make test-deps downloads it): %w: %s", err, strings.TrimSpace(errb.String()))
			return
		}
		binPath = strings.TrimSpace(out.String())
	})
	return binPath, binErr
}

// Verify checks a certificate Pebble issued as a cell would serve it: the
// key is the leaf's, and the chain verifies up to Pebble's issuing root
// for every hostname. It returns the leaf.
func (ca *CA) Verify(ctx context.Context, chainPEM, keyPEM []byte, hostnames ...string) (*x509.Certificate, error) {
	pair, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("chain and key are not a pair: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	root, err := ca.IssuerRoot(ctx)
	if err != nil {
		return nil, err
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		inter.AddCert(c)
	}
	for _, h := range hostnames {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: roots, Intermediates: inter}); err != nil {
			return nil, fmt.Errorf("%s: %w", h, err)
		}
	}
	return leaf, nil
}
