// Package config owns the agent's configuration file: its schema, documented
// defaults, strict decoding and validation. It knows nothing of processes or
// cgroups. cmd/cellvisor and cmd/cellvisor-demo load it and agent hands
// its parts to runtime, cgroup and supervisor: agent, cmd/cellvisor and
// cmd/cellvisor-demo import it.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"
)

// DefaultPath is where the packaged agent looks for its configuration.
const DefaultPath = "/etc/cellvisor/agent.yaml"

// ErrInvalid marks a configuration that failed validation.
var ErrInvalid = errors.New("invalid configuration")

// Agent is the whole agent configuration file.
type Agent struct {
	// StateDir holds the topology, assignments and each slot's runtime, cache,
	// temporary and log directories.
	StateDir string `yaml:"state_dir"`
	// RunDir holds sockets (admin, per-cell private) and pid files.
	RunDir string `yaml:"run_dir"`
	// Slots is the number of cell slots, 1–32. Fixed once the topology exists.
	Slots int `yaml:"slots"`
	// OpenResty chooses the binary that runs the cells.
	OpenResty OpenResty `yaml:"openresty"`
	// Ports are the bases from which each slot's ports are derived.
	Ports Ports `yaml:"ports"`
	// Limits are every cell's resource limits.
	Limits Limits `yaml:"limits"`
	// AgentLimits go on the agent's own leaf cgroup.
	AgentLimits AgentLimits `yaml:"agent_limits"`
	// Cgroup says where the agent's cgroup subtree is.
	Cgroup Cgroup `yaml:"cgroup"`
	// Restart is the crash-restart policy.
	Restart Restart `yaml:"restart"`
	// Liveness is how ready cells are checked for hanging.
	Liveness Liveness `yaml:"liveness"`
	// Log chooses the log format and level.
	Log Log `yaml:"log"`
	// DomainsDir, when set, is a local directory of domain JSON files that the
	// agent compiles into its cells' runtime at start (standalone mode, before a
	// control plane is configured). Empty means none.
	DomainsDir string `yaml:"domains_dir"`
	// Source is where signed manifests come from.
	Source Source `yaml:"source"`
	// IdentityFile holds the edge id and the pinned control-plane key; empty
	// means <state_dir>/identity.json.
	IdentityFile string `yaml:"identity_file"`
	// Egress is the governed-egress send path of an enrolled edge.
	Egress Egress `yaml:"egress"`
	// Metrics is the Prometheus endpoint.
	Metrics Metrics `yaml:"metrics"`
	// Topology is the edge's region, zone and locality (optional).
	Topology Topology `yaml:"topology"`
	// CellUsers chooses the users cells run as: "auto" (the default) each
	// slot's own user (cellvisor-cell-NN) where the agent can switch to
	// them, else the agent's, saying so; "slot" those or refuse to start;
	// "agent" the agent's own.
	CellUsers string `yaml:"cell_users"`
	// RuntimeUpgrade says how cells reach a new openresty.binary (or
	// module) a package installed: "auto" (the default) rolled one at a
	// time once verified, "paced" the same with RuntimeUpgradePace
	// between two cells, "manual" when an operator runs
	// cellvisor upgrade-runtime.
	RuntimeUpgrade string `yaml:"runtime_upgrade"`
	// RuntimeUpgradePace is, under "paced", how long a rolled cell must
	// stay ready on the new runtime before the next is rolled.
	RuntimeUpgradePace Duration `yaml:"runtime_upgrade_pace"`
}

// CellUsersMode is cell_users with its default (auto) filled in.
func (c Agent) CellUsersMode() string {
	if c.CellUsers == "" {
		return "auto"
	}
	return c.CellUsers
}

// Egress configures the agent's outbound bundles (security events as
// siem_forwarding, per-cell request counts as metering), their journal
// and the intake that serves the org's peers while this edge holds a
// class's lease. It runs on an edge enrolled with a control API that named
// its org.
type Egress struct {
	// IntakeListen is the intake's host:port (HTTPS, mutual TLS with the
	// edges' enrollment identities); empty means no intake: this edge then
	// never forwards to itself, and peers fall back to direct sends.
	IntakeListen string `yaml:"intake_listen"`
	// IntakeURL is the intake as peers reach it (reported to the control
	// API); empty means https://<intake_listen>.
	IntakeURL string `yaml:"intake_url"`
	// Interval is how often the cells' counters become bundles; 0 turns
	// the producers off (the send path still delivers what is journaled).
	Interval Duration `yaml:"interval"`
	// JournalBundles and JournalBytes bound the bundle journal: at the
	// bound new bundles are refused and counted, the journaled ones kept.
	JournalBundles int   `yaml:"journal_bundles"`
	JournalBytes   Bytes `yaml:"journal_bytes"`
	// ProbeTimeout bounds a destination reachability probe (TCP connect).
	ProbeTimeout Duration `yaml:"probe_timeout"`
	// SendTimeout bounds one send to a destination or a holder's intake.
	SendTimeout Duration `yaml:"send_timeout"`
	// MaxRenew caps the wait between two elections of a class (the
	// control API's answer says when to ask again; it is used when sooner).
	MaxRenew Duration `yaml:"max_renew"`
	// IntakeMaxConns bounds the intake's connections open at once, half
	// of them at most not through their handshake; IntakeMaxConnsPerIP one
	// peer address's; IntakeHandshakeTimeout closes a connection not
	// through its mutual-TLS handshake (outbound.IntakeLimits: the
	// defaults are sized from the agent's memory there).
	IntakeMaxConns         int      `yaml:"intake_max_conns"`
	IntakeMaxConnsPerIP    int      `yaml:"intake_max_conns_per_ip"`
	IntakeHandshakeTimeout Duration `yaml:"intake_handshake_timeout"`
}

// Metrics configures the agent's Prometheus endpoint (GET /metrics).
type Metrics struct {
	// Listen is the endpoint's IP:port; empty turns it off. An IP literal,
	// loopback unless AllowRemote.
	Listen string `yaml:"listen"`
	// AllowRemote lets Listen be a non-loopback address (the endpoint has no
	// authentication: firewall it).
	AllowRemote bool `yaml:"allow_remote"`
	// MaxConns bounds the endpoint's connections open at once, half of
	// them at most without a first request; HandshakeTimeout closes a
	// connection whose first request's headers have not come within it
	// (agentmetrics.DefaultMaxConns: sized from the agent's memory).
	MaxConns         int      `yaml:"max_conns"`
	HandshakeTimeout Duration `yaml:"handshake_timeout"`
}

// Source configures the manifest source.
type Source struct {
	// Dir is a manifest spool directory (manifests/, artifacts/, acks/), for
	// edges fed by file transfer. Empty means none.
	Dir string `yaml:"dir"`
	// PollInterval is how often the source is asked for a newer manifest.
	PollInterval Duration `yaml:"poll_interval"`
	// MaxBackoff caps the retry delay while the source is unreachable.
	MaxBackoff Duration `yaml:"max_backoff"`
	// ApplyTimeout bounds the wait for cells to report a new release.
	ApplyTimeout Duration `yaml:"apply_timeout"`
	// PollTimeout bounds everything one poll fetches together: every page,
	// every artifact and the recovery snapshot.
	PollTimeout Duration `yaml:"poll_timeout"`
	// StatusInterval is how often an enrolled agent looks at its status:
	// it sends it to the control API when it changed, and otherwise at
	// the (longer) interval the control API assigns.
	StatusInterval Duration `yaml:"status_interval"`
}

// Identity returns the identity file's path.
func (c Agent) Identity() string {
	if c.IdentityFile != "" {
		return c.IdentityFile
	}
	return filepath.Join(c.StateDir, "identity.json")
}

// IdentityDir holds the enrolled edge's key, certificate and CAs.
func (c Agent) IdentityDir() string { return filepath.Join(filepath.Dir(c.Identity()), "identity") }

// OpenResty configures the cell binary.
type OpenResty struct {
	// Binary is the OpenResty (or nginx with the Lua module) executable.
	Binary string `yaml:"binary"`
	// Modules are dynamic modules to load_module before anything else, for an
	// nginx that has the Lua module as a dynamic module (Debian's packages).
	// Empty for an openresty binary, which has Lua built in.
	Modules []string `yaml:"modules"`
	// ReadyTimeout bounds the wait for a started cell to answer its
	// readiness probe (a worker must answer /.cellvisor/ready).
	ReadyTimeout Duration `yaml:"ready_timeout"`
	// StopTimeout is the graceful-stop grace period (SIGQUIT) before SIGKILL.
	StopTimeout Duration `yaml:"stop_timeout"`
	// WorkerShutdownTimeout bounds how long old workers linger after a reload,
	// so reloads never stack workers inside a cell's memory limit.
	WorkerShutdownTimeout Duration `yaml:"worker_shutdown_timeout"`
	// WorkerConnections is each cell worker's connection limit.
	WorkerConnections int `yaml:"worker_connections"`
	// ClientHeaderTimeout bounds the whole of a request's head (nginx's
	// client_header_timeout): a client trickling its headers is closed.
	ClientHeaderTimeout Duration `yaml:"client_header_timeout"`
	// ClientBodyTimeout bounds each read of a request body
	// (client_body_timeout).
	ClientBodyTimeout Duration `yaml:"client_body_timeout"`
	// SendTimeout bounds each write to a client that does not read
	// (send_timeout).
	SendTimeout Duration `yaml:"send_timeout"`
	// ExposeCell adds X-Cellvisor-Cell (the cell's name) to the answers
	// the cell makes itself: for debugging; off, the public sees nothing
	// of the host's topology.
	ExposeCell bool `yaml:"expose_cell"`
	// Resolvers are the DNS servers the cells ask for origin names
	// ("address" or "address:port"); empty means the host's
	// /etc/resolv.conf nameservers.
	Resolvers []string `yaml:"resolvers"`
	// OriginCAFile is the CA bundle https origins' certificates are
	// verified against.
	OriginCAFile string `yaml:"origin_ca_file"`
}

// Ports configures the per-slot listeners. Slot i (1-based) listens on
// HTTPBase+i-1 and HTTPSBase+i-1.
type Ports struct {
	HTTPBase  int `yaml:"http_base"`
	HTTPSBase int `yaml:"https_base"`
	// Address is the address the public listeners bind; empty means all.
	Address string `yaml:"address"`
}

// Limits are per-cell limits.
type Limits struct {
	// Enforce refuses to start cells where the limits cannot be enforced.
	// Only an explicit false runs cells without limits.
	Enforce *bool `yaml:"enforce"`
	Memory  Bytes `yaml:"memory"`
	// CPU is in CPUs: 0.5 means quota 50000 per period 100000.
	CPU        float64 `yaml:"cpu"`
	PIDs       int64   `yaml:"pids"`
	Cache      Bytes   `yaml:"cache"`
	RequestTmp Bytes   `yaml:"request_tmp"`
	Logs       Bytes   `yaml:"logs"`
}

// AgentLimits are the agent's own limits.
type AgentLimits struct {
	Memory Bytes   `yaml:"memory"`
	CPU    float64 `yaml:"cpu"`
}

// Cgroup locates the agent's cgroup subtree.
type Cgroup struct {
	// Root is the cgroup filesystem mount; "/sys/fs/cgroup" unless testing.
	Root string `yaml:"root"`
	// Subtree is a directory created under the agent's own cgroup to hold the
	// agent leaf and the cells. Empty (the systemd Delegate=yes layout) uses the
	// agent's own cgroup directly.
	Subtree string `yaml:"subtree"`
	// PlaceAgent moves the agent into its own limited leaf ("agent").
	PlaceAgent *bool `yaml:"place_agent"`
	// Scope puts the cells in a delegated systemd scope of their own, so
	// that they outlive a restart of the agent's unit: "auto" (the default)
	// when running under systemd with a reachable system bus, "on" always
	// (refuse to start without it), "off" never.
	Scope string `yaml:"scope"`
}

// Restart is the crash-restart backoff policy and the operator-restart limits.
type Restart struct {
	// InitialDelay is the delay before the second restart in a row; the first
	// restart after a healthy period is immediate.
	InitialDelay Duration `yaml:"initial_delay"`
	// MaxDelay caps the delay; a crash-looping cell keeps being retried at it.
	MaxDelay Duration `yaml:"max_delay"`
	// HealthyAfter resets the backoff once a cell has been ready this long.
	HealthyAfter Duration `yaml:"healthy_after"`
	// RateLimit is how many operator restarts a cell accepts in RateWindow.
	RateLimit  int      `yaml:"rate_limit"`
	RateWindow Duration `yaml:"rate_window"`
	// DrainTimeout bounds the wait for requests in flight before an operator
	// restart stops the cell (SIGKILL past it).
	DrainTimeout Duration `yaml:"drain_timeout"`
}

// Liveness is how a ready cell is checked for hanging: its readiness path
// on its public port every Interval, each check bounded by Timeout. After
// FailureThreshold failed checks in a row the cell is degraded; after
// RestartThreshold it is restarted like a crash. A drained cell's 503 is an
// answer.
type Liveness struct {
	// Interval between checks; 0 turns liveness checks off.
	Interval Duration `yaml:"interval"`
	// Timeout of one check.
	Timeout          Duration `yaml:"timeout"`
	FailureThreshold int      `yaml:"failure_threshold"`
	RestartThreshold int      `yaml:"restart_threshold"`
}

// Log configures the agent's logger.
type Log struct {
	// Format is "json" (journald) or "console" (the demo).
	Format string `yaml:"format"`
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
}

// Default returns the shipped defaults.
func Default() Agent {
	t := true
	return Agent{
		StateDir: "/var/lib/cellvisor",
		RunDir:   "/run/cellvisor",
		Slots:    8,
		OpenResty: OpenResty{
			Binary:                "/usr/local/openresty/bin/openresty",
			ReadyTimeout:          Duration(10 * time.Second),
			StopTimeout:           Duration(10 * time.Second),
			WorkerShutdownTimeout: Duration(30 * time.Second),
			WorkerConnections:     4096,
			ClientHeaderTimeout:   Duration(10 * time.Second),
			ClientBodyTimeout:     Duration(10 * time.Second),
			SendTimeout:           Duration(10 * time.Second),
			OriginCAFile:          "/etc/ssl/certs/ca-certificates.crt",
		},
		Ports: Ports{HTTPBase: 10080, HTTPSBase: 10443},
		Limits: Limits{
			Enforce:    &t,
			Memory:     512 * MiB,
			CPU:        0.5,
			PIDs:       128,
			Cache:      256 * MiB,
			RequestTmp: 64 * MiB,
			Logs:       16 * MiB,
		},
		AgentLimits: AgentLimits{Memory: 128 * MiB, CPU: 0.25},
		Cgroup:      Cgroup{Root: "/sys/fs/cgroup", PlaceAgent: &t, Scope: ScopeAuto},
		Restart: Restart{
			InitialDelay: Duration(100 * time.Millisecond),
			MaxDelay:     Duration(2 * time.Minute),
			HealthyAfter: Duration(30 * time.Second),
			RateLimit:    3,
			RateWindow:   Duration(10 * time.Minute),
			DrainTimeout: Duration(30 * time.Second),
		},
		Liveness: Liveness{
			Interval:         Duration(time.Second),
			Timeout:          Duration(time.Second),
			FailureThreshold: 3,
			RestartThreshold: 6,
		},
		Log:                Log{Format: "json", Level: "info"},
		RuntimeUpgrade:     "auto",
		RuntimeUpgradePace: Duration(5 * time.Minute),
		// The connection caps are sized from the agent's 128 MiB: see
		// outbound.IntakeLimits and agentmetrics.DefaultMaxConns for the
		// arithmetic (config imports neither, so the numbers are repeated).
		Metrics: Metrics{Listen: "127.0.0.1:9464", MaxConns: 16, HandshakeTimeout: Duration(3 * time.Second)},
		Egress: Egress{Interval: Duration(30 * time.Second), JournalBundles: 10000, JournalBytes: 64 * MiB,
			ProbeTimeout: Duration(2 * time.Second), SendTimeout: Duration(10 * time.Second), MaxRenew: Duration(time.Minute),
			IntakeMaxConns: 128, IntakeMaxConnsPerIP: 16, IntakeHandshakeTimeout: Duration(3 * time.Second)},
		Source: Source{PollInterval: Duration(5 * time.Second), MaxBackoff: Duration(2 * time.Minute), ApplyTimeout: Duration(30 * time.Second), PollTimeout: Duration(10 * time.Minute), StatusInterval: Duration(15 * time.Second)},
	}
}

// Load reads, strictly decodes and validates a configuration file. Fields the
// file leaves out keep their defaults.
func Load(path string) (Agent, error) {
	data, err := readConfig(path)
	if err != nil {
		return Agent{}, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return Agent{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// MaxFileBytes bounds the configuration file.
const MaxFileBytes = 1 << 20

// readConfig reads a configuration file that must be a regular file (a link
// to one is followed: configuration management links them) of at most
// MaxFileBytes: a FIFO or device in its place would hang the start or a
// SIGHUP reload, a huge file would grow the agent. Opened non-blocking, so
// that a FIFO is refused instead of waited on.
func readConfig(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	case fi.Size() > MaxFileBytes:
		return nil, fmt.Errorf("%s is %d bytes, over the %d-byte bound", path, fi.Size(), MaxFileBytes)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err == nil && len(data) > MaxFileBytes {
		err = fmt.Errorf("%s grew over the %d-byte bound while read", path, MaxFileBytes)
	}
	return data, err
}

// Parse decodes YAML over the defaults, refusing unknown fields, then validates.
func Parse(data []byte) (Agent, error) {
	c := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, errEOF) {
		return Agent{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := c.Validate(); err != nil {
		return Agent{}, err
	}
	return c, nil
}

// Enforced reports whether limits must be enforced (anything but an explicit false).
func (c Agent) Enforced() bool { return c.Limits.Enforce == nil || *c.Limits.Enforce }

// Values of cgroup.scope.
const (
	ScopeAuto = "auto"
	ScopeOn   = "on"
	ScopeOff  = "off"
)

// ScopeMode is cgroup.scope with its default (auto) filled in.
func (c Agent) ScopeMode() string {
	if c.Cgroup.Scope == "" {
		return ScopeAuto
	}
	return c.Cgroup.Scope
}

// AgentPlaced reports whether the agent moves itself into its own leaf cgroup.
func (c Agent) AgentPlaced() bool { return c.Cgroup.PlaceAgent == nil || *c.Cgroup.PlaceAgent }

// Validate checks every field and names each bad one with its allowed range,
// in the order of the fields: the same configuration always gets the same
// error, word for word (no map iteration decides the order).
func (c Agent) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalid, field, fmt.Sprintf(format, args...)))
	}
	for _, f := range []struct{ name, path string }{{"state_dir", c.StateDir}, {"run_dir", c.RunDir}, {"cgroup.root", c.Cgroup.Root}} {
		if !filepath.IsAbs(f.path) {
			bad(f.name, "must be an absolute path, got %q", f.path)
		}
	}
	if c.DomainsDir != "" && !filepath.IsAbs(c.DomainsDir) {
		bad("domains_dir", "must be an absolute path, got %q", c.DomainsDir)
	}
	if c.Source.Dir != "" && !filepath.IsAbs(c.Source.Dir) {
		bad("source.dir", "must be an absolute path, got %q", c.Source.Dir)
	}
	if c.Source.Dir != "" && c.DomainsDir != "" {
		bad("domains_dir", "cannot be used together with source.dir: one source of configuration")
	}
	if c.IdentityFile != "" && !filepath.IsAbs(c.IdentityFile) {
		bad("identity_file", "must be an absolute path, got %q", c.IdentityFile)
	}
	if d := c.Source.PollInterval.D(); d < 100*time.Millisecond || d > time.Hour {
		bad("source.poll_interval", "must be 100ms–1h, got %s", d)
	}
	if d := c.Source.MaxBackoff.D(); d < c.Source.PollInterval.D() || d > time.Hour {
		bad("source.max_backoff", "must be poll_interval–1h, got %s", d)
	}
	if d := c.Source.ApplyTimeout.D(); d < 100*time.Millisecond || d > 10*time.Minute {
		bad("source.apply_timeout", "must be 100ms–10m, got %s", d)
	}
	if d := c.Source.PollTimeout.D(); d < time.Second || d > time.Hour {
		bad("source.poll_timeout", "must be 1s–1h, got %s", d)
	}
	if d := c.Source.StatusInterval.D(); d < 100*time.Millisecond || d > time.Hour {
		bad("source.status_interval", "must be 100ms–1h, got %s", d)
	}
	if c.StateDir != "" && c.StateDir == c.RunDir {
		bad("run_dir", "must differ from state_dir")
	}
	if c.Slots < 1 || c.Slots > 32 {
		bad("slots", "must be 1–32, got %d", c.Slots)
	}
	if c.OpenResty.Binary == "" {
		bad("openresty.binary", "must be set")
	}
	for i, m := range c.OpenResty.Modules {
		if !filepath.IsAbs(m) {
			bad(fmt.Sprintf("openresty.modules[%d]", i), "must be an absolute path, got %q", m)
		}
	}
	if d := c.OpenResty.ReadyTimeout.D(); d < 100*time.Millisecond || d > 5*time.Minute {
		bad("openresty.ready_timeout", "must be 100ms–5m, got %s", d)
	}
	if d := c.OpenResty.StopTimeout.D(); d < 100*time.Millisecond || d > 10*time.Minute {
		bad("openresty.stop_timeout", "must be 100ms–10m, got %s", d)
	}
	if d := c.OpenResty.WorkerShutdownTimeout.D(); d < time.Second || d > 10*time.Minute {
		bad("openresty.worker_shutdown_timeout", "must be 1s–10m, got %s", d)
	}
	if n := c.OpenResty.WorkerConnections; n < 16 || n > 65536 {
		bad("openresty.worker_connections", "must be 16–65536, got %d", n)
	}
	for _, t := range []struct {
		name string
		d    Duration
	}{{"client_header_timeout", c.OpenResty.ClientHeaderTimeout}, {"client_body_timeout", c.OpenResty.ClientBodyTimeout}, {"send_timeout", c.OpenResty.SendTimeout}} {
		if d := t.d.D(); d < time.Second || d > 5*time.Minute {
			bad("openresty."+t.name, "must be 1s–5m, got %s", d)
		}
	}
	for i, r := range c.OpenResty.Resolvers {
		if !validResolver(r) {
			bad(fmt.Sprintf("openresty.resolvers[%d]", i), "must be an IP address, optionally with :port ([v6]:port), got %q", r)
		}
	}
	if len(c.OpenResty.Resolvers) > 8 {
		bad("openresty.resolvers", "at most 8, got %d", len(c.OpenResty.Resolvers))
	}
	if f := c.OpenResty.OriginCAFile; f != "" && !filepath.IsAbs(f) {
		bad("openresty.origin_ca_file", "must be an absolute path, got %q", f)
	}
	c.validatePorts(bad)
	if m := c.Limits.Memory; m < 16*MiB {
		bad("limits.memory", "must be at least 16MiB, got %s", m)
	}
	if cpu := c.Limits.CPU; cpu < 0.01 || cpu > float64(runtime.NumCPU()) {
		bad("limits.cpu", "must be 0.01–%d (CPUs on this host), got %g", runtime.NumCPU(), cpu)
	}
	if p := c.Limits.PIDs; p < 8 || p > 4194304 {
		bad("limits.pids", "must be 8–4194304, got %d", p)
	}
	for _, f := range []struct {
		name string
		b    Bytes
	}{{"limits.cache", c.Limits.Cache}, {"limits.request_tmp", c.Limits.RequestTmp}, {"limits.logs", c.Limits.Logs}} {
		if f.b < MiB {
			bad(f.name, "must be at least 1MiB, got %s", f.b)
		}
	}
	if m := c.AgentLimits.Memory; m < 32*MiB {
		bad("agent_limits.memory", "must be at least 32MiB, got %s", m)
	}
	if cpu := c.AgentLimits.CPU; cpu < 0.05 || cpu > float64(runtime.NumCPU()) {
		bad("agent_limits.cpu", "must be 0.05–%d, got %g", runtime.NumCPU(), cpu)
	}
	switch c.CellUsers {
	case "", "auto", "slot", "agent":
	default:
		bad("cell_users", "must be auto, slot or agent, got %q", c.CellUsers)
	}
	switch c.RuntimeUpgrade {
	case "", "auto", "paced", "manual":
	default:
		bad("runtime_upgrade", "must be auto, paced or manual, got %q", c.RuntimeUpgrade)
	}
	if d := c.RuntimeUpgradePace.D(); d < 10*time.Second || d > 24*time.Hour {
		bad("runtime_upgrade_pace", "must be 10s–24h, got %s", d)
	}
	switch c.Cgroup.Scope {
	case "", ScopeAuto, ScopeOn, ScopeOff:
	default:
		bad("cgroup.scope", "must be auto, on or off, got %q", c.Cgroup.Scope)
	}
	if s := c.Cgroup.Subtree; s != "" && (strings.ContainsAny(s, "/\\") || s == "." || s == ".." || s == "agent" || strings.HasPrefix(s, "cell-")) {
		bad("cgroup.subtree", "must be a single directory name other than agent or cell-*, got %q", s)
	}
	r := c.Restart
	if d := r.InitialDelay.D(); d < time.Millisecond || d > time.Minute {
		bad("restart.initial_delay", "must be 1ms–1m, got %s", d)
	}
	if d := r.MaxDelay.D(); d < r.InitialDelay.D() || d > 30*time.Minute {
		bad("restart.max_delay", "must be initial_delay–30m, got %s", d)
	}
	if d := r.HealthyAfter.D(); d < time.Second || d > time.Hour {
		bad("restart.healthy_after", "must be 1s–1h, got %s", d)
	}
	if n := r.RateLimit; n < 1 || n > 1000 {
		bad("restart.rate_limit", "must be 1–1000, got %d", n)
	}
	if d := r.RateWindow.D(); d < time.Second || d > 24*time.Hour {
		bad("restart.rate_window", "must be 1s–24h, got %s", d)
	}
	if d := r.DrainTimeout.D(); d < 100*time.Millisecond || d > 10*time.Minute {
		bad("restart.drain_timeout", "must be 100ms–10m, got %s", d)
	}
	l := c.Liveness
	if d := l.Interval.D(); d != 0 && (d < 100*time.Millisecond || d > time.Minute) {
		bad("liveness.interval", "must be 0 (off) or 100ms–1m, got %s", d)
	}
	if d := l.Timeout.D(); d < 10*time.Millisecond || d > 30*time.Second {
		bad("liveness.timeout", "must be 10ms–30s, got %s", d)
	}
	if n := l.FailureThreshold; n < 1 || n > 100 {
		bad("liveness.failure_threshold", "must be 1–100, got %d", n)
	}
	if n := l.RestartThreshold; n < l.FailureThreshold || n > 1000 {
		bad("liveness.restart_threshold", "must be failure_threshold–1000, got %d", n)
	}
	c.validateEgress(bad)
	c.validateMetrics(bad)
	c.Topology.validate(bad)
	switch c.Log.Format {
	case "json", "console":
	default:
		bad("log.format", "must be json or console, got %q", c.Log.Format)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	return errors.Join(errs...)
}

func (c Agent) validatePorts(bad func(field, format string, args ...any)) {
	p := c.Ports
	n := max(c.Slots, 1)
	for _, f := range []struct {
		name string
		base int
	}{{"ports.http_base", p.HTTPBase}, {"ports.https_base", p.HTTPSBase}} {
		if f.base < 1 || f.base+n-1 > 65535 {
			bad(f.name, "must be 1–%d for %d slots, got %d", 65535-n+1, n, f.base)
		}
	}
	// The two ranges [base, base+n) must not overlap.
	if p.HTTPBase < p.HTTPSBase+n && p.HTTPSBase < p.HTTPBase+n {
		bad("ports.https_base", "range %d–%d collides with ports.http_base range %d–%d",
			p.HTTPSBase, p.HTTPSBase+n-1, p.HTTPBase, p.HTTPBase+n-1)
	}
}

func (c Agent) validateEgress(bad func(field, format string, args ...any)) {
	e := c.Egress
	if e.IntakeListen != "" {
		if host, port, err := net.SplitHostPort(e.IntakeListen); err != nil || port == "" || port == "0" {
			bad("egress.intake_listen", "must be host:port with a port, got %q", e.IntakeListen)
		} else if host == "" {
			bad("egress.intake_listen", "must name the address to listen on (0.0.0.0 for all), got %q", e.IntakeListen)
		}
	}
	if e.IntakeURL != "" {
		if u, err := url.Parse(e.IntakeURL); err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
			bad("egress.intake_url", "must be https://host:port, got %q", e.IntakeURL)
		}
	}
	if e.IntakeListen == "" && e.IntakeURL != "" {
		bad("egress.intake_url", "needs egress.intake_listen")
	}
	if d := e.Interval.D(); d != 0 && (d < 100*time.Millisecond || d > time.Hour) {
		bad("egress.interval", "must be 0 (off) or 100ms–1h, got %s", d)
	}
	if n := e.JournalBundles; n < 1 || n > 1000000 {
		bad("egress.journal_bundles", "must be 1–1000000, got %d", n)
	}
	if b := e.JournalBytes; b < MiB || b > 64*1024*MiB {
		bad("egress.journal_bytes", "must be 1MiB–64GiB, got %s", b)
	}
	if d := e.ProbeTimeout.D(); d < 10*time.Millisecond || d > 30*time.Second {
		bad("egress.probe_timeout", "must be 10ms–30s, got %s", d)
	}
	if d := e.SendTimeout.D(); d < 100*time.Millisecond || d > 5*time.Minute {
		bad("egress.send_timeout", "must be 100ms–5m, got %s", d)
	}
	if d := e.MaxRenew.D(); d < 100*time.Millisecond || d > 30*time.Minute {
		bad("egress.max_renew", "must be 100ms–30m, got %s", d)
	}
	// Each connection may cost up to 64 KiB: 1024 is 64 MiB, half the
	// agent's memory, and the most that can make sense.
	if n := e.IntakeMaxConns; n < 8 || n > 1024 {
		bad("egress.intake_max_conns", "must be 8–1024, got %d", n)
	}
	if n := e.IntakeMaxConnsPerIP; n < 1 || n > e.IntakeMaxConns {
		bad("egress.intake_max_conns_per_ip", "must be 1–egress.intake_max_conns (%d), got %d", e.IntakeMaxConns, n)
	}
	if d := e.IntakeHandshakeTimeout.D(); d < 100*time.Millisecond || d > 30*time.Second {
		bad("egress.intake_handshake_timeout", "must be 100ms–30s, got %s", d)
	}
}

// validateMetrics checks metrics.listen: an IP literal and a port (no name
// to resolve at start), loopback unless metrics.allow_remote.
func (c Agent) validateMetrics(bad func(field, format string, args ...any)) {
	if n := c.Metrics.MaxConns; n < 2 || n > 256 {
		bad("metrics.max_conns", "must be 2–256, got %d", n)
	}
	if d := c.Metrics.HandshakeTimeout.D(); d < 100*time.Millisecond || d > 30*time.Second {
		bad("metrics.handshake_timeout", "must be 100ms–30s, got %s", d)
	}
	l := c.Metrics.Listen
	if l == "" {
		return
	}
	host, port, err := net.SplitHostPort(l)
	if err != nil {
		bad("metrics.listen", "must be IP:port, got %q: %v", l, err)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		bad("metrics.listen", "port must be 0–65535, got %q", port)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		bad("metrics.listen", "host must be an IP address without zone (127.0.0.1, ::1), got %q", host)
		return
	}
	if !ip.IsLoopback() && !c.Metrics.AllowRemote {
		bad("metrics.listen", "%s is not a loopback address: the endpoint has no authentication; set metrics.allow_remote: true to serve it there", host)
	}
}

// validResolver is an IP address, or one with a port: "address:port",
// "[v6]:port".
func validResolver(r string) bool {
	if net.ParseIP(r) != nil {
		return true
	}
	host, port, err := net.SplitHostPort(r)
	if err != nil || net.ParseIP(host) == nil {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535
}
