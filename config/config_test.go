package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestDefaultsAreValidAndShipTheSeedLimits(t *testing.T) {
	c, err := Parse([]byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Slots != 8 || c.Limits.Memory != 512*MiB || c.Limits.CPU != 0.5 || c.Limits.PIDs != 128 ||
		c.Limits.Cache != 256*MiB || c.Limits.RequestTmp != 64*MiB || c.Limits.Logs != 16*MiB ||
		c.AgentLimits.Memory != 128*MiB || c.AgentLimits.CPU != 0.25 || !c.Enforced() {
		t.Errorf("defaults: %+v", c)
	}
}

func TestParseOverridesAndUnits(t *testing.T) {
	c, err := Parse([]byte("slots: 4\nlimits:\n  memory: 1GiB\n  enforce: false\nrestart:\n  max_delay: 5m\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Slots != 4 || c.Limits.Memory != GiB || c.Enforced() || c.Restart.MaxDelay.D().Minutes() != 5 {
		t.Errorf("got %+v", c)
	}
	if c.Limits.PIDs != 128 {
		t.Errorf("unset field lost its default: pids %d", c.Limits.PIDs)
	}
}

func TestRefusals(t *testing.T) {
	tests := []struct{ name, yaml, field string }{
		{"slot count zero", "slots: 0", "slots"},
		{"slot count over 32", "slots: 33", "slots"},
		{"relative state dir", "state_dir: var/lib", "state_dir"},
		{"unknown cell users", "cell_users: nobody", "cell_users"},
		{"unknown runtime upgrade policy", "runtime_upgrade: nightly", "runtime_upgrade"},
		{"runtime upgrade pace too short", "runtime_upgrade_pace: 1s", "runtime_upgrade_pace"},
		{"runtime upgrade pace over a day", "runtime_upgrade_pace: 25h", "runtime_upgrade_pace"},
		{"unknown field", "slot: 8", "field slot not found"},
		{"bad size", "limits:\n  memory: lots", "bad size"},
		{"memory too small", "limits:\n  memory: 1MiB", "limits.memory"},
		{"cpu zero", "limits:\n  cpu: 0", "limits.cpu"},
		{"pids too small", "limits:\n  pids: 2", "limits.pids"},
		{"port range past 65535", "ports:\n  http_base: 65530", "ports.http_base"},
		{"http and https ranges collide", "ports:\n  http_base: 8000\n  https_base: 8004", "collides"},
		{"bad duration", "restart:\n  max_delay: soon", "bad duration"},
		{"max delay below initial", "restart:\n  initial_delay: 1s\n  max_delay: 10ms", "restart.max_delay"},
		{"bad log format", "log:\n  format: xml", "log.format"},
		{"subtree with slash", "cgroup:\n  subtree: a/b", "cgroup.subtree"},
		{"unknown scope mode", "cgroup:\n  scope: maybe", "cgroup.scope"},
		{"relative module", "openresty:\n  modules: [lua.so]", "openresty.modules[0]"},
		{"resolver a name", "openresty:\n  resolvers: [dns.example]", "openresty.resolvers[0]"},
		{"resolver port 0", "openresty:\n  resolvers: [\"127.0.0.1:0\"]", "openresty.resolvers[0]"},
		{"nine resolvers", "openresty:\n  resolvers: [1.1.1.1, 1.1.1.2, 1.1.1.3, 1.1.1.4, 1.1.1.5, 1.1.1.6, 1.1.1.7, 1.1.1.8, 1.1.1.9]", "openresty.resolvers"},
		{"relative origin CA file", "openresty:\n  origin_ca_file: ca.pem", "openresty.origin_ca_file"},
		{"liveness interval too short", "liveness:\n  interval: 10ms", "liveness.interval"},
		{"liveness timeout zero", "liveness:\n  timeout: 0s", "liveness.timeout"},
		{"intake without a port", "egress:\n  intake_listen: 127.0.0.1", "egress.intake_listen"},
		{"intake url over plain http", "egress:\n  intake_listen: 127.0.0.1:9443\n  intake_url: http://127.0.0.1:9443", "egress.intake_url"},
		{"intake url without a listener", "egress:\n  intake_url: https://edge.example:9443", "egress.intake_url"},
		{"egress interval too short", "egress:\n  interval: 1ms", "egress.interval"},
		{"egress journal without room", "egress:\n  journal_bundles: 0", "egress.journal_bundles"},
		{"egress journal under a bundle", "egress:\n  journal_bytes: 4096", "egress.journal_bytes"},
		{"intake connection cap too small", "egress:\n  intake_max_conns: 2", "egress.intake_max_conns"},
		{"intake connection cap too large", "egress:\n  intake_max_conns: 100000", "egress.intake_max_conns"},
		{"intake per-address cap over the cap", "egress:\n  intake_max_conns: 16\n  intake_max_conns_per_ip: 17", "egress.intake_max_conns_per_ip"},
		{"intake per-address cap zero", "egress:\n  intake_max_conns_per_ip: 0", "egress.intake_max_conns_per_ip"},
		{"intake handshake too long", "egress:\n  intake_handshake_timeout: 1m", "egress.intake_handshake_timeout"},
		{"metrics connection cap too small", "metrics:\n  max_conns: 1", "metrics.max_conns"},
		{"metrics handshake zero", "metrics:\n  handshake_timeout: 0s", "metrics.handshake_timeout"},
		{"metrics on a public address", "metrics:\n  listen: 192.0.2.1:9464", "allow_remote"},
		{"metrics on all addresses", "metrics:\n  listen: 0.0.0.0:9464", "not a loopback"},
		{"metrics on a host name", "metrics:\n  listen: localhost:9464", "metrics.listen"},
		{"metrics without port", "metrics:\n  listen: 127.0.0.1", "metrics.listen"},
		{"metrics port out of range", "metrics:\n  listen: 127.0.0.1:70000", "metrics.listen"},
		{"restart threshold below failure threshold", "liveness:\n  failure_threshold: 5\n  restart_threshold: 4", "liveness.restart_threshold"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %q", err, tc.field)
			}
		})
	}
}

func TestEgressDefaultsAndOverrides(t *testing.T) {
	c, err := Parse([]byte("egress:\n  intake_listen: 127.0.0.1:9443\n  interval: 200ms\n  journal_bundles: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Egress
	if e.IntakeListen != "127.0.0.1:9443" || e.Interval.D() != 200*time.Millisecond || e.JournalBundles != 5 ||
		e.JournalBytes != 64*MiB || e.SendTimeout.D() != 10*time.Second {
		t.Errorf("egress %+v", e)
	}
	if d := Default().Egress; d.IntakeListen != "" || d.Interval.D() != 30*time.Second {
		t.Errorf("egress defaults %+v: want no intake and a 30s interval", d)
	}
	if d := Default().Egress; d.IntakeMaxConns != 128 || d.IntakeMaxConnsPerIP != 16 || d.IntakeHandshakeTimeout.D() != 3*time.Second {
		t.Errorf("egress defaults %+v: want the intake's connections bounded at 128, 16 per address, handshakes in 3s", d)
	}
}

// metrics.listen takes loopback, nothing (off), or any IP once allowed.
func TestMetricsListenAccepted(t *testing.T) {
	for _, y := range []string{
		"metrics:\n  listen: \"\"",
		"metrics:\n  listen: \"[::1]:9464\"",
		"metrics:\n  listen: 127.0.0.2:0",
		"metrics:\n  listen: 0.0.0.0:9464\n  allow_remote: true",
	} {
		if _, err := Parse([]byte(y)); err != nil {
			t.Errorf("%q: %v", y, err)
		}
	}
}

func TestBytesRoundTrip(t *testing.T) {
	for in, want := range map[string]Bytes{"512MiB": 512 * MiB, "64M": 64 * MiB, "1GiB": GiB, "4096": 4 * KiB, "7": 7} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseBytes("-1MiB"); err == nil {
		t.Error("negative size accepted")
	}
}

// The packaged configuration parses, validates and says what the defaults
// are.
func TestPackagedConfigIsTheDefaults(t *testing.T) {
	got, err := Load("../systemd/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	if len(got.OpenResty.Modules) == 0 && len(want.OpenResty.Modules) == 0 {
		got.OpenResty.Modules, want.OpenResty.Modules = nil, nil // [] in the file
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("systemd/agent.yaml differs from the defaults:\n got %+v\nwant %+v", got, want)
	}
}

// The file is read only if it is a regular file within its bound: a FIFO
// in its place is refused at once (not waited on), a device or a huge
// sparse file is refused; a link to a good file is followed.
func TestLoadRefusesAnythingButABoundedRegularFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(good, []byte("slots: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(link); err != nil || c.Slots != 4 {
		t.Errorf("through a link: %v, slots %d", err, c.Slots)
	}
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(64 << 30)
	f.Close()
	for path, want := range map[string]string{fifo: "not a regular file", "/dev/zero": "not a regular file", huge: "over the"} {
		done := make(chan error, 1)
		go func() { _, err := Load(path); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", path, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Load hung", path) // the bug this guards against
		}
	}
}

// Validate names every bad field in the order of the fields, the same way
// every time: fields checked from a map came out in a random order (issue 33).
func TestValidateNamesBadFieldsInOrder(t *testing.T) {
	c := Default()
	c.StateDir, c.RunDir, c.Cgroup.Root = "state", "run", "cgroup"
	c.Limits.Cache, c.Limits.RequestTmp, c.Limits.Logs = 1, 2, 3
	c.Ports.HTTPBase, c.Ports.HTTPSBase = 0, 70000
	c.Topology = Topology{Region: "eu central", Zone: "a/b", Locality: "fra!"}
	want := []string{"state_dir", "run_dir", "cgroup.root", "ports.http_base", "ports.https_base",
		"limits.cache", "limits.request_tmp", "limits.logs", "topology.region", "topology.zone", "topology.locality"}
	first := c.Validate()
	if first == nil {
		t.Fatal("no error")
	}
	var got []string
	for _, line := range strings.Split(first.Error(), "\n") {
		field, _, _ := strings.Cut(strings.TrimPrefix(line, ErrInvalid.Error()+": "), ":")
		got = append(got, field)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields named %q, want %q", got, want)
	}
	for range 20 {
		if err := c.Validate(); err.Error() != first.Error() {
			t.Fatalf("the same configuration, another error:\n%v\nthen\n%v", first, err)
		}
	}
}

// Resolvers are addresses, with or without a port, v4 and v6.
func TestResolversAccepted(t *testing.T) {
	c, err := Parse([]byte("openresty:\n  resolvers: [127.0.0.53, \"127.0.0.1:5353\", \"::1\", \"[::1]:53\"]"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.OpenResty.Resolvers) != 4 {
		t.Errorf("resolvers %v", c.OpenResty.Resolvers)
	}
}
