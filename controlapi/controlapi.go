// Package controlapi is cellvisor-control: the minimal control API. It owns
// the two HTTP APIs (the admin API behind a bearer token, and the
// edge-control API over TLS, mutual for everything but enrollment), the
// control plane's keys (a CA for edge identities and an Ed25519 key that
// signs artifacts, both sealed at rest with a key file), and the in-memory
// cache that keeps the polls of a whole fleet cheap, and it wires its
// parts together: the admin API's wire contract (controlapi/adminapi),
// the store (controlapi/store), the fleet page (controlapi/fleet), the
// egress lease service (controlapi/lease), the snapshot file cache
// (controlapi/snapcache), the metrics and the PKI. cmd/cellvisor-control
// and cmd/cellvisor-demo run it (Serve), as do cmd/cellvisor's end-to-end
// tests.
package controlapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/acmeissue"
	"cellvisor/controlapi/fleet"
	"cellvisor/controlapi/lease"
	"cellvisor/controlapi/metrics"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/snapcache"
	"cellvisor/controlapi/store"
	"cellvisor/edgeapi"
)

// DefaultPollWakeRate is the held polls a publish wakes a second: about
// what one SQLite replica on 2 cores builds (a manifest build costs about
// 1 ms of the one writer) with room for the acks and reports that follow
// (BenchmarkFleetLoad, docs/control.md: at 1,000 a second, 2,000 edges'
// acks waited 0.9 s at the median). A publish reaches 10,000 held edges
// in 40 s.
const DefaultPollWakeRate = 250

// Options configure a Server.
type Options struct {
	// Store is the open database. Required.
	Store *store.Store
	// SealKey seals the CA and signing keys at rest (pki.KeyFile). Every
	// replica sharing a database needs the same one. Required.
	SealKey []byte
	// AdminToken is the admin API's bearer token. Required.
	AdminToken string
	// Hostnames name the edge-control API in its server certificate (DNS
	// names or IPs); nil means localhost, 127.0.0.1 and ::1.
	Hostnames []string
	// PollWakeRate is how many held polls a second a publish wakes (spread
	// at random over len/rate seconds, so that their builds, acks and
	// status reports do not come at once); zero means DefaultPollWakeRate.
	PollWakeRate int
	// Refresh is how often the poll cache catches up with the database
	// (changes made by other replicas); zero means 1s.
	Refresh time.Duration
	// TouchInterval is how often last-seen times are written; zero means
	// 10s.
	TouchInterval time.Duration
	// LastSeenBound is how far an edge's last-seen time moves before this
	// replica writes it again; zero means 60s. The database's last-seen
	// times lag by at most LastSeenBound + TouchInterval (this replica's
	// own view, in edge show and the metrics, not at all).
	LastSeenBound time.Duration
	// StatusInterval is the longest an agent goes without sending its
	// status while nothing in it changed (edgeapi.HeaderStatusInterval on
	// every poll answer); zero means edgeapi.DefaultStatusInterval, else
	// edgeapi.MinStatusInterval–edgeapi.MaxStatusInterval. The poll is
	// the heartbeat: this does not make an edge silent sooner or later.
	StatusInterval time.Duration
	// StatusRewrite is how long a status report that changes nothing but
	// its measurements (see statusDigest) is not written again; zero means
	// half the StatusInterval, so that every report an agent sends on its
	// interval refreshes the stored one.
	StatusRewrite time.Duration
	// Admission bounds each request class's requests in work at once on
	// the edge-control listener (a class at its bound answers 429 with
	// Retry-After); a class missing or zero means DefaultAdmission's.
	Admission Admission
	// MetricsToken is a bearer token that reads /metrics on the admin
	// listener and nothing else (the admin token reads it too); empty
	// means the admin token only.
	MetricsToken string
	// ClientCertTTL is how long the edges' client certificates are valid,
	// from enrollment or renewal; zero means pki.ClientValidity (a year).
	// Edges renew theirs between 70 % and 90 % of it.
	ClientCertTTL time.Duration
	// SnapshotDir holds the recovery snapshots being served, as unlinked
	// files (nothing stays there); empty means the system's temporary
	// directory. Not a tmpfs: its files would count as memory.
	SnapshotDir string
	// SnapshotDownloads bounds the recovery snapshots served at a time;
	// zero means DefaultSnapshotDownloads.
	SnapshotDownloads int
	// SnapshotPerEdge and SnapshotPerOrg are one edge's and one org's
	// shares of them; zero means DefaultSnapshotPerEdge (1) and
	// DefaultSnapshotPerOrg (half).
	SnapshotPerEdge, SnapshotPerOrg int
	// SnapshotMinRate is the slowest a snapshot download may be on
	// average, bytes a second (a slower one is cut); zero means
	// DefaultSnapshotMinRate.
	SnapshotMinRate int64
	// MoveTick is how often the move loop looks at the moves under way
	// (it also runs on every ack and status report); zero means 2s.
	MoveTick time.Duration
	// MoveReadyWithin bounds how long a move waits for its target cells
	// to apply the domain and report ready before it fails; zero means
	// 5 minutes.
	MoveReadyWithin time.Duration
	// EgressLease is how long an egress lease lasts unless renewed
	// (holders renew every third of it); zero means DefaultEgressLease,
	// at most MaxEgressLease. It is also the live window: an edge not seen
	// for that long is not a candidate.
	EgressLease time.Duration
	// EgressReachWindow is how long an edge's reported probe of a
	// destination counts; zero means twice the lease, at least a minute
	// and at least the StatusInterval and two minutes (an unchanged
	// status, its probes' times with it, comes every StatusInterval).
	EgressReachWindow time.Duration
	// CertMargin is how long a domain's certificate must still be valid
	// for the domain to be published with it; zero means
	// DefaultCertMargin.
	CertMargin time.Duration
	// ACME, when set, obtains and renews the certificates of the domains
	// that ask for them (acme.go).
	ACME *ACMEOptions
	// Logger, or nil for none.
	Logger *zap.Logger
	// Now is the clock, or nil for time.Now.
	Now func() time.Time
}

// Server is the control API.
type Server struct {
	o       Options
	log     *zap.Logger
	st      *store.Store
	ca      *pki.CA
	cert    tls.Certificate
	clients *x509.CertPool
	cache   *cache
	// writer group-commits acks and status reports (store.Batcher); Run
	// runs it.
	writer  *store.Batcher
	metrics *metrics.Metrics
	fleet   *fleet.Pages
	leases  *lease.Service
	// admission bounds the edge-control API's request classes.
	admission *admitter

	keyMu sync.Mutex // guards the following fields
	// keys caches opened signing keys by their sealed form: the current
	// one is read from the store by every write that signs (see
	// store.Signer), so that a rotation on any replica holds on all.
	keys  map[string]ed25519.PrivateKey
	snaps *snapcache.Cache
	// kek encrypts certificates' private keys at rest (CertKEKSetting).
	kek []byte
	// moveNudge wakes the move loop (acks, status reports, new moves).
	moveNudge chan struct{}
	// holds is closed by StopHolds: every held poll answers at once.
	holds     chan struct{}
	holdsOnce sync.Once
	// acme keeps the ACME domains certified (nil: ACME is off); Run runs
	// it.
	acme *acmeissue.Scheduler
}

// StopHolds answers every held poll at once, and holds no more: call it
// when the edge listener shuts down (http.Server.RegisterOnShutdown), so
// that shutting down does not wait out their holds. Run calls it when it
// ends.
func (s *Server) StopHolds() { s.holdsOnce.Do(func() { close(s.holds) }) }

// New loads the control plane's keys from the store, creating them on
// first start (the first of several replicas starting together wins), and
// issues this replica's server certificate.
func New(ctx context.Context, o Options) (*Server, error) {
	switch {
	case o.Store == nil:
		return nil, errors.New("controlapi: no store")
	case len(o.SealKey) != 32:
		return nil, errors.New("controlapi: seal key must be 32 bytes")
	case len(o.AdminToken) < 16:
		return nil, errors.New("controlapi: admin token must be at least 16 characters")
	}
	if o.Hostnames == nil {
		o.Hostnames = []string{"localhost", "127.0.0.1", "::1"}
	}
	if o.PollWakeRate <= 0 {
		o.PollWakeRate = DefaultPollWakeRate
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Second
	}
	if o.TouchInterval <= 0 {
		o.TouchInterval = 10 * time.Second
	}
	if o.LastSeenBound <= 0 {
		o.LastSeenBound = time.Minute
	}
	if o.StatusInterval == 0 {
		o.StatusInterval = edgeapi.DefaultStatusInterval
	}
	if o.StatusInterval < edgeapi.MinStatusInterval || o.StatusInterval > edgeapi.MaxStatusInterval {
		return nil, fmt.Errorf("controlapi: status interval %s: want %s–%s", o.StatusInterval, edgeapi.MinStatusInterval, edgeapi.MaxStatusInterval)
	}
	if o.StatusRewrite <= 0 {
		o.StatusRewrite = o.StatusInterval / 2
	}
	admission, err := newAdmitter(o.Admission)
	if err != nil {
		return nil, err
	}
	if o.ClientCertTTL <= 0 {
		o.ClientCertTTL = pki.ClientValidity
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SnapshotDir == "" {
		o.SnapshotDir = os.TempDir()
	}
	if o.SnapshotPerEdge <= 0 {
		o.SnapshotPerEdge = DefaultSnapshotPerEdge
	}
	if o.SnapshotMinRate <= 0 {
		o.SnapshotMinRate = DefaultSnapshotMinRate
	}
	if o.SnapshotDownloads <= 0 {
		o.SnapshotDownloads = DefaultSnapshotDownloads
	}
	if o.MoveTick <= 0 {
		o.MoveTick = 2 * time.Second
	}
	if o.MoveReadyWithin <= 0 {
		o.MoveReadyWithin = 5 * time.Minute
	}
	if err := egressDefaults(&o); err != nil {
		return nil, err
	}
	s := &Server{o: o, log: o.Logger.Named("control"), st: o.Store, admission: admission, moveNudge: make(chan struct{}, 1), holds: make(chan struct{})}
	if o.SnapshotPerOrg <= 0 {
		o.SnapshotPerOrg = DefaultSnapshotPerOrg(o.SnapshotDownloads)
	}
	if s.snaps, err = snapcache.New(snapcache.Options{Dir: o.SnapshotDir, Downloads: o.SnapshotDownloads, PerEdge: o.SnapshotPerEdge,
		PerOrg: o.SnapshotPerOrg, MinRate: o.SnapshotMinRate, Logger: s.log}); err != nil {
		return nil, err
	}
	if s.fleet, err = fleet.New(fleet.Options{Reader: newFleetReader(s), AdminToken: o.AdminToken, Logger: s.log, Now: o.Now}); err != nil {
		return nil, err
	}
	s.metrics = metrics.New(metrics.Options{Fleet: s.fleetSeen, Leases: s.metricLeases, Pools: s.poolsReader(), Now: o.Now, Logger: s.log})
	s.metrics.Classes(Classes)
	// The store is this server's: it reports its writes and placements here.
	s.st.Hooks = store.Hooks{Wrote: s.metrics.Write, Placed: s.metrics.Placement, Batch: s.metrics.Batch, Retried: func(err error) {
		s.metrics.Retry()
		s.log.Debug("database write run again: the database could not serialize it at once", zap.Error(err))
	}}
	s.writer = s.st.NewBatcher(0)
	if s.ca, err = s.loadCA(ctx); err != nil {
		return nil, err
	}
	if o.CertMargin == 0 {
		s.o.CertMargin = DefaultCertMargin
	}
	if err = s.initCertKEK(ctx); err != nil {
		return nil, err
	}
	s.st.SealKey = s.sealCertKey
	if err = s.initSigningKey(ctx); err != nil {
		return nil, err
	}
	if n, err := s.st.SignMissingHeaders(ctx, s.sign); err != nil {
		return nil, fmt.Errorf("sign manifest headers: %w", err)
	} else if n > 0 {
		s.log.Info("signed the headers of manifests written before headers existed", zap.Int("edges", n))
	}
	if n, err := s.st.FirstManifests(ctx, s.sign); err != nil {
		return nil, fmt.Errorf("first manifests: %w", err)
	} else if n > 0 {
		s.log.Info("gave edges still at sequence 0 their first manifest, empty", zap.Int("edges", n))
	}
	s.clients = x509.NewCertPool()
	s.clients.AddCert(s.ca.Cert)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, _, err := s.ca.IssueServer(o.Hostnames, &key.PublicKey, o.Now())
	if err != nil {
		return nil, err
	}
	s.cert = tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
	s.cache = newCache(s.st, s.log, o.PollWakeRate)
	if s.leases, err = lease.New(lease.Options{Store: s.st, Lease: o.EgressLease, ReachWindow: o.EgressReachWindow,
		TouchInterval: o.TouchInterval, LastSeen: s.cache.lastSeen, Logger: s.log, Now: o.Now}); err != nil {
		return nil, err
	}
	if err := s.cache.refresh(ctx); err != nil {
		return nil, err
	}
	if o.ACME != nil {
		acme := *o.ACME
		if s.acme, err = s.newACME(&acme); err != nil {
			return nil, err
		}
	}
	return s, nil
}

type sealedCA struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

func (s *Server) loadCA(ctx context.Context) (*pki.CA, error) {
	ca, keyDER, err := pki.NewCA(s.o.Now())
	if err != nil {
		return nil, err
	}
	sealed, err := pki.Seal(s.o.SealKey, "ca-key", keyDER)
	if err != nil {
		return nil, err
	}
	candidate, _ := json.Marshal(sealedCA{Cert: ca.PEM, Key: sealed})
	stored, err := s.st.InitSetting(ctx, "ca", string(candidate))
	if err != nil {
		return nil, err
	}
	var sc sealedCA
	if err := json.Unmarshal([]byte(stored), &sc); err != nil {
		return nil, fmt.Errorf("stored CA: %w", err)
	}
	keyDER, err = pki.Open(s.o.SealKey, "ca-key", sc.Key)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	return pki.LoadCA(sc.Cert, keyDER)
}

// initSigningKey creates the signing key on first start (the first of
// several replicas starting together wins).
func (s *Server) initSigningKey(ctx context.Context) error {
	sealed, err := s.newSealedKey()
	if err != nil {
		return err
	}
	stored, err := s.st.InitSetting(ctx, store.SigningKeySetting, sealed)
	if err != nil {
		return err
	}
	_, err = s.sign(stored)
	return err
}

func (s *Server) newSealedKey() (string, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	return pki.Seal(s.o.SealKey, "signing-key", priv.Seed())
}

// CAPEM is the CA certificate: what agents pass as --ca-file to trust the
// edge-control API, and what issued their client certificates.
func (s *Server) CAPEM() string { return s.ca.PEM }

// PublicKey is the standard base64 Ed25519 key that signs manifests now:
// the one a newly enrolled edge pins. Empty when the store cannot be read.
func (s *Server) PublicKey() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sealed, err := s.st.Setting(ctx, store.SigningKeySetting)
	if err != nil {
		s.log.Error("read the signing key", zap.Error(err))
		return ""
	}
	priv, err := s.sign(sealed)
	if err != nil {
		s.log.Error("open the signing key", zap.Error(err))
		return ""
	}
	return base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
}

// sign opens a sealed signing key (a store.Signer), once per key.
func (s *Server) sign(sealed string) (ed25519.PrivateKey, error) {
	s.keyMu.Lock()
	defer s.keyMu.Unlock()
	if k, ok := s.keys[sealed]; ok {
		return k, nil
	}
	seed, err := pki.Open(s.o.SealKey, "signing-key", sealed)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if len(seed) != ed25519.SeedSize {
		return nil, errors.New("signing key: stored seed has the wrong size")
	}
	if s.keys == nil {
		s.keys = map[string]ed25519.PrivateKey{}
	}
	k := ed25519.NewKeyFromSeed(seed)
	s.keys[sealed] = k
	return k, nil
}

// EdgeTLSConfig is the edge-control listener's TLS configuration: this
// replica's server certificate, and client certificates verified against
// the CA when given (enrollment comes without one; every other handler
// requires it).
func (s *Server) EdgeTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{s.cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    s.clients,
	}
}

// ServerCertificate is this replica's server certificate, for an admin
// listener served over TLS.
func (s *Server) ServerCertificate() tls.Certificate { return s.cert }

// Run keeps the poll cache current, commits acks and status reports in
// batches, writes last-seen times and drives the moves under way until ctx
// ends, then writes last-seen times a last time. Edge requests that write
// wait for it: serve them only while it runs.
func (s *Server) Run(ctx context.Context) {
	moves, writer := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(moves)
		s.runMoves(ctx)
	}()
	go func() {
		defer close(writer)
		s.writer.Run(ctx)
	}()
	acme := make(chan struct{})
	go func() {
		defer close(acme)
		if s.acme != nil {
			_ = s.acme.Run(ctx) // ends with ctx
		}
	}()
	defer func() { <-moves; <-writer; <-acme }()
	defer s.StopHolds()
	refresh := time.NewTicker(s.o.Refresh)
	defer refresh.Stop()
	touch := time.NewTicker(s.o.TouchInterval)
	defer touch.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s.flushSeen(fctx, 0)
			cancel()
			s.snaps.Close()
			return
		case <-refresh.C:
			if err := s.cache.refresh(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("refresh edge cache", zap.Error(err))
			}
		case <-touch.C:
			s.cache.seeHeld(s.o.Now())
			s.flushSeen(ctx, s.o.LastSeenBound)
		}
	}
}

// flushSeen writes the last-seen times that moved by at least bound.
func (s *Server) flushSeen(ctx context.Context, bound time.Duration) {
	seen := s.cache.dueSeen(bound)
	if len(seen) == 0 {
		return
	}
	if err := s.st.Touch(ctx, seen); err != nil {
		s.log.Warn("record last seen", zap.Error(err))
		return
	}
	s.cache.wroteSeen(seen)
	s.metrics.LastSeenRows(len(seen))
}

// fleetSeen is every edge's last-seen time for the metrics: the
// database's, or this replica's own when newer.
func (s *Server) fleetSeen(ctx context.Context) ([]metrics.EdgeSeen, error) {
	edges, err := s.st.LastSeen(ctx)
	if err != nil {
		return nil, err
	}
	mine := s.cache.allSeen()
	out := make([]metrics.EdgeSeen, len(edges))
	for i, e := range edges {
		out[i] = metrics.EdgeSeen{ID: e.ID, Enrolled: e.Enrolled, LastSeen: e.LastSeen}
		if at := mine[e.ID]; at.After(e.LastSeen) {
			out[i].LastSeen = at
		}
	}
	return out, nil
}

// Metrics are the control API's series, served on the admin listener.
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }
