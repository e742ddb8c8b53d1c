package controlapi

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
)

// Config is how cellvisor-control serve runs.
type Config struct {
	// Data holds the SQLite database, the key file and the admin token
	// unless given elsewhere, and ca.pem, the CA certificate.
	Data string
	// DB is a postgres:// URL, or empty for <Data>/control.db.
	DB string
	// Listen is the edge-control API's address (TLS).
	Listen string
	// AdminListen is the admin API's address: plain HTTP, so loopback
	// only, unless AdminTLS.
	AdminListen string
	// AdminTLS serves the admin API over TLS with the server certificate.
	AdminTLS bool
	// Hostnames go in the server certificate; nil means localhost and the
	// loopback addresses.
	Hostnames []string
	// KeyFile seals keys at rest; empty means <Data>/seal.key.
	KeyFile string
	// AdminTokenFile holds the admin token, created when absent; empty
	// means <Data>/admin.token.
	AdminTokenFile string
	// MetricsTokenFile holds the token that reads /metrics (and nothing
	// else), created when absent; empty means <Data>/metrics.token.
	MetricsTokenFile string
	// MoveTick and MoveReadyWithin are Options' (zero: their defaults).
	MoveTick, MoveReadyWithin time.Duration
	// EgressLease is Options' (zero: DefaultEgressLease).
	EgressLease time.Duration
	// CertMargin is Options' (zero: DefaultCertMargin).
	CertMargin time.Duration
	// StatusInterval, Admission and PollWakeRate are Options' (zero: their
	// defaults).
	StatusInterval time.Duration
	Admission      Admission
	PollWakeRate   int
	// EdgeLimits bound the edge-control listener's connections (zero
	// fields: DefaultEdgeMaxConns, DefaultEdgeMaxPending, no cap per
	// address, DefaultEdgeHandshakeTimeout).
	EdgeLimits ListenLimits
	// ACMEDirectory, ACMEEmail and ACMECAFile configure automatic
	// certificates (ACMEOptions; docs/tls.md): the CA's directory URL
	// (empty: off), the account's contact, and a PEM file of the roots
	// that verify a private CA's directory (empty: the system's).
	ACMEDirectory, ACMEEmail, ACMECAFile string
	// Logger, or nil for none.
	Logger *zap.Logger
}

// Endpoints are where a running control API answers.
type Endpoints struct {
	EdgeURL    string
	AdminURL   string
	CA         string
	AdminToken string
	PublicKey  string
}

// AdminToken reads the admin token file, creating it (0600) with a random
// token when absent.
func AdminToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		t := strings.TrimSpace(string(data))
		if len(t) < 16 {
			return "", fmt.Errorf("admin token file %s: token shorter than 16 characters", path)
		}
		return t, nil
	}
	if !os.IsNotExist(err) {
		return "", fmt.Errorf("admin token: %w", err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	t := "cva_" + hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("admin token: %w", err)
	}
	return t, nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Serve runs the control API until ctx ends. ready, if not nil, is called
// once both listeners accept connections.
func Serve(ctx context.Context, c Config, ready func(Endpoints)) error {
	log := c.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if c.Data == "" {
		return errors.New("no data directory")
	}
	if !c.AdminTLS && !isLoopback(c.AdminListen) {
		return fmt.Errorf("admin listen %s: plain HTTP is served on loopback only; pass --admin-tls to serve it elsewhere", c.AdminListen)
	}
	if err := os.MkdirAll(c.Data, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if c.KeyFile == "" {
		c.KeyFile = filepath.Join(c.Data, "seal.key")
	}
	if c.AdminTokenFile == "" {
		c.AdminTokenFile = filepath.Join(c.Data, "admin.token")
	}
	if c.MetricsTokenFile == "" {
		c.MetricsTokenFile = filepath.Join(c.Data, "metrics.token")
	}
	if c.DB == "" {
		c.DB = filepath.Join(c.Data, "control.db")
	}
	key, err := pki.KeyFile(c.KeyFile)
	if err != nil {
		return err
	}
	token, err := AdminToken(c.AdminTokenFile)
	if err != nil {
		return err
	}
	metricsToken, err := AdminToken(c.MetricsTokenFile)
	if err != nil {
		return fmt.Errorf("metrics token: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := store.Open(octx, c.DB)
	cancel()
	if err != nil {
		return err
	}
	defer st.Close()
	acme, err := ACMEConfig(c.ACMEDirectory, c.ACMEEmail, c.ACMECAFile)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	srv, err := New(sctx, Options{Store: st, SealKey: key, AdminToken: token, MetricsToken: metricsToken, Hostnames: c.Hostnames, SnapshotDir: c.Data, Logger: log,
		MoveTick: c.MoveTick, MoveReadyWithin: c.MoveReadyWithin, EgressLease: c.EgressLease, CertMargin: c.CertMargin, ACME: acme,
		StatusInterval: c.StatusInterval, Admission: c.Admission, PollWakeRate: c.PollWakeRate})
	cancel()
	if err != nil {
		return err
	}
	// The CA certificate is public: agents pass it as --ca-file, and admin
	// clients trust it for an --admin-tls admin API.
	if err := os.WriteFile(filepath.Join(c.Data, "ca.pem"), []byte(srv.CAPEM()), 0o644); err != nil {
		return fmt.Errorf("write CA certificate: %w", err)
	}
	rawEdge, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("edge-control listen: %w", err)
	}
	edgeLn, edgeTLS, err := srv.ListenEdge(rawEdge, c.EdgeLimits)
	if err != nil {
		rawEdge.Close()
		return err
	}
	rawAdmin, err := net.Listen("tcp", c.AdminListen)
	if err != nil {
		edgeLn.Close()
		return fmt.Errorf("admin listen: %w", err)
	}
	adminScheme := "http"
	var adminTLS *tls.Config
	if c.AdminTLS {
		adminScheme = "https"
		adminTLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srv.ServerCertificate()}}
	}
	adminLn, err := srv.ListenAdmin(rawAdmin, adminTLS)
	if err != nil {
		edgeLn.Close()
		rawAdmin.Close()
		return err
	}
	edgeHS := &http.Server{Handler: srv.EdgeHandler(), TLSConfig: edgeTLS, ConnState: edgeLn.ConnState, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 60 * time.Second, WriteTimeout: 5 * time.Minute, IdleTimeout: 5 * time.Minute, ErrorLog: zap.NewStdLog(log.Named("http"))}
	adminHS := &http.Server{Handler: srv.AdminHandler(), TLSConfig: adminTLS, ConnState: adminLn.ConnState, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: zap.NewStdLog(log.Named("admin-http"))}
	edgeHS.RegisterOnShutdown(srv.StopHolds)
	errs := make(chan error, 2)
	go func() { errs <- edgeHS.Serve(edgeLn) }()
	go func() { errs <- adminHS.Serve(adminLn) }()
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); srv.Run(runCtx) }()
	ep := Endpoints{EdgeURL: "https://" + edgeLn.Addr().String(), AdminURL: adminScheme + "://" + adminLn.Addr().String(),
		CA: srv.CAPEM(), AdminToken: token, PublicKey: srv.PublicKey()}
	log.Info("control API serving", zap.String("edge_api", ep.EdgeURL), zap.String("admin_api", ep.AdminURL),
		zap.String("store", st.Dialect()), zap.Strings("hostnames", srv.cert.Leaf.DNSNames))
	if ready != nil {
		ready(ep)
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = errors.Join(edgeHS.Shutdown(shut), adminHS.Shutdown(shut))
	stopRun()
	<-runDone
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return err
}
