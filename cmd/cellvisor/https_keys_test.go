package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"cellvisor/controlapi"
	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/internal/testcert"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
	"cellvisor/tlsseal"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) Sync() error    { return nil }
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// A certificate's key reaches the enrolled agent sealed to its encryption
// key, through the real binaries: the manifest is applied, and neither the
// control API's log, the agent's log nor its status carries the key. An
// agent that lost its key (as one enrolled before encryption keys has
// none) makes one at its start and registers it; the control API seals
// to it and the agent applies that.
func TestHTTPSKeysReachTheAgentSealed(t *testing.T) {
	testutil.RequireRoot(t)
	bin := buildAgent(t)
	logs := &lockedBuf{}
	c := startControl(t, t.TempDir(), "127.0.0.1:0", func(cfg *controlapi.Config) {
		cfg.Logger = zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), logs, zap.DebugLevel))
	})
	cfgPath, cfg := agentConfig(t, 2, "source:\n  poll_interval: 100ms\n  max_backoff: 400ms\n  status_interval: 200ms\n")
	created, err := c.admin.CreateEdge(ctxT(t), adminapi.EdgeRequest{Name: "tls", Org: "acme", Country: "NL", Continent: "EU", Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, []byte(c.ep.CA), 0o644)
	if out, err := runCLI(t, bin, "--config", cfgPath, "enroll", "--control", c.ep.EdgeURL, "--token", created.Token, "--ca-file", caFile); err != nil {
		t.Fatalf("enroll: %v\n%s", err, out)
	}
	keyFile := filepath.Join(cfg.IdentityDir(), controlclient.EncKeyFile)
	if st, err := os.Stat(keyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("encryption key file: %v %v", st, err)
	}

	cert := testcert.New(t, testcert.Options{Names: []string{"app.test"}})
	if _, err := c.admin.PutCertificate(ctxT(t), "app", adminapi.CertificateRequest{Chain: string(cert.PEM()), Key: string(cert.Key)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.admin.Publish(ctxT(t), "app.test", adminapi.DomainRequest{Pool: "shared-default", Config: json.RawMessage(
		`{"hostnames":["app.test"],"routes":[{"prefix":"/","respond":{"status":200,"body":"v1"}}],"tls":{"certificate":"app"}}`)}); err != nil {
		t.Fatal(err)
	}
	applied := func(what string) adminapi.EdgeView {
		t.Helper()
		return c.awaitEdge(t, created.Edge.ID, what, func(v adminapi.EdgeView) bool {
			return v.Sequence > 1 && v.ActiveSequence == v.Sequence && len(v.Acks) > 0 && v.Acks[0].Status == manifest.AckApplied
		})
	}
	keyID := func() string {
		t.Helper()
		k, err := controlclient.LoadEncryptionKey(cfg.IdentityDir())
		if err != nil {
			t.Fatal(err)
		}
		return tlsseal.KeyID(k.PublicKey())
	}

	a, st := startAgent(t, bin, cfgPath, cfg)
	awaitBody(t, st.Slots[0].HTTPPort, "v1")
	v := applied("the sealed key's manifest applied")
	// And the cell serves the domain over HTTPS with it, verified up to
	// the certificate's root, by HTTP/2.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(cert.Root)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", st.Slots[0].HTTPSPort))
		},
	}}
	resp, err := hc.Get("https://app.test/")
	if err != nil {
		t.Fatalf("https://app.test/ through the cell: %v", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(got)) != "v1" || resp.ProtoMajor != 2 {
		t.Errorf("https://app.test/: %s %s %q", resp.Proto, resp.Status, got)
	}
	if v.EncryptionKeyID != keyID() {
		t.Fatalf("edge view key %s, the agent's %s", v.EncryptionKeyID, keyID())
	}
	for _, ack := range v.Acks {
		if ack.Status != manifest.AckApplied {
			t.Fatalf("ack %+v", ack)
		}
	}
	// The control API learns what the cell presents, summed up.
	c.awaitEdge(t, created.Edge.ID, "the cell's certificate in the edge's view", func(v adminapi.EdgeView) bool {
		return len(v.Certificates) == 1 && v.Certificates[0].Cell == "cell-01" && v.Certificates[0].Count == 1 &&
			v.Certificates[0].SoonestDomain == "app.test" && v.Certificates[0].SoonestExpiry.After(time.Now().Add(24*time.Hour))
	})
	status, err := runCLI(t, bin, "--config", cfgPath, "status", "-o", "json")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, status)
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}

	// The key lost: the agent makes a new one and registers it.
	old := v.EncryptionKeyID
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	a, _ = startAgent(t, bin, cfgPath, cfg)
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, err := os.Stat(keyFile); err != nil {
			return err
		}
		v, err := c.admin.Edge(ctxT(t), created.Edge.ID)
		if err != nil {
			return err
		}
		if v.EncryptionKeyID == old || v.EncryptionKeyID != keyID() {
			return fmt.Errorf("edge key %s, the agent's new one not registered yet", v.EncryptionKeyID)
		}
		return nil
	})
	applied("the manifest sealed to the new key applied")
	if code := a.stop(t); code != 0 {
		t.Fatalf("agent exit %d", code)
	}

	agentLog, _ := os.ReadFile(a.log)
	body := strings.Split(string(cert.Key), "\n")[1]
	for what, s := range map[string]string{"the control API's log": logs.String(), "the agent's log": string(agentLog), "the agent's status": status} {
		if strings.Contains(s, body) {
			t.Errorf("%s carries the private key", what)
		}
	}
	if !strings.Contains(logs.String(), "certificate stored") || !strings.Contains(string(agentLog), "encryption key registered") {
		t.Error("the logs were not captured")
	}
}
