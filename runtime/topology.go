package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/sysfile"
)

// ErrTopologyChanged is returned when the configuration asks for a topology
// other than the one persisted at creation.
var ErrTopologyChanged = errors.New("topology is fixed at creation")

// ErrCollision is returned when two slots, or a slot and another listener,
// would share a port or a path.
var ErrCollision = errors.New("topology collision")

const topologyFile = "topology.json"

// Layout is what the topology is derived from.
type Layout struct {
	Slots     int
	HTTPBase  int
	HTTPSBase int
	// Address the public listeners bind ("" for all); used to probe ports.
	Address  string
	StateDir string
	RunDir   string
}

// Slot is one cell slot's identity, ports and paths.
type Slot struct {
	Name      string `json:"name"`
	Index     int    `json:"index"`
	HTTPPort  int    `json:"http_port"`
	HTTPSPort int    `json:"https_port"`
	// Dir is <state_dir>/cells/cell-NN.
	Dir string `json:"dir"`
	// RunDir is <run_dir>/cell-NN (private socket, pid file).
	RunDir string `json:"run_dir"`
}

// Paths derived from a slot's directories.
func (s Slot) RuntimeDir() string    { return filepath.Join(s.Dir, "runtime") }
func (s Slot) CacheDir() string      { return filepath.Join(s.Dir, "cache") }
func (s Slot) TmpDir() string        { return filepath.Join(s.Dir, "tmp") }
func (s Slot) RequestTmpDir() string { return filepath.Join(s.Dir, "tmp", "request") }
func (s Slot) LogsDir() string       { return filepath.Join(s.Dir, "logs") }
func (s Slot) PidFile() string       { return filepath.Join(s.RunDir, "nginx.pid") }
func (s Slot) PrivateSocket() string { return filepath.Join(s.RunDir, "private.sock") }

// CacheUseFile is where the agent writes what the cell's cache holds
// ("BYTES UNIX_MS"), for the cell to keep within its budget.
func (s Slot) CacheUseFile() string { return filepath.Join(s.RunDir, "cache-used") }

// SecretFile holds the cell's private-endpoint secret (mode 0600).
func (s Slot) SecretFile() string { return filepath.Join(s.Dir, "secret") }

// DrainedMarker exists while the slot is drained; it survives agent restarts.
func (s Slot) DrainedMarker() string { return filepath.Join(s.Dir, "drained") }

// DrainConf is the nginx include with the slot's keepalive setting.
func (s Slot) DrainConf() string { return filepath.Join(s.Dir, "drain.conf") }

// ConfPath is the nginx.conf of the active release, through the current link.
func (s Slot) ConfPath() string { return filepath.Join(s.RuntimeDir(), "current", "nginx.conf") }

// Topology is the persisted, immutable set of slots.
type Topology struct {
	Version   int       `json:"version"`
	CreatedAt time.Time `json:"created_at"`
	HTTPBase  int       `json:"http_base"`
	HTTPSBase int       `json:"https_base"`
	Slots     []Slot    `json:"slots"`
}

// SlotName is the stable name of 1-based slot i.
func SlotName(i int) string { return fmt.Sprintf("cell-%02d", i) }

// Plan derives the topology for a layout without touching anything.
func Plan(l Layout) Topology {
	t := Topology{Version: 1, HTTPBase: l.HTTPBase, HTTPSBase: l.HTTPSBase}
	for i := 1; i <= l.Slots; i++ {
		name := SlotName(i)
		t.Slots = append(t.Slots, Slot{
			Name:      name,
			Index:     i,
			HTTPPort:  l.HTTPBase + i - 1,
			HTTPSPort: l.HTTPSBase + i - 1,
			Dir:       filepath.Join(l.StateDir, "cells", name),
			RunDir:    filepath.Join(l.RunDir, name),
		})
	}
	return t
}

// Check refuses a topology in which two slots share a port or a path.
func (t Topology) Check() error {
	ports := map[int]string{}
	paths := map[string]string{}
	for _, s := range t.Slots {
		for _, p := range []struct {
			port int
			what string
		}{{s.HTTPPort, s.Name + " http"}, {s.HTTPSPort, s.Name + " https"}} {
			if other, ok := ports[p.port]; ok {
				return fmt.Errorf("%w: port %d of %s is also %s", ErrCollision, p.port, p.what, other)
			}
			ports[p.port] = p.what
		}
		for _, d := range []string{s.Dir, s.RunDir} {
			if other, ok := paths[d]; ok {
				return fmt.Errorf("%w: path %s of %s is also used by %s", ErrCollision, d, s.Name, other)
			}
			paths[d] = s.Name
		}
	}
	return nil
}

// Slot returns the named slot.
func (t Topology) Slot(name string) (Slot, bool) {
	for _, s := range t.Slots {
		if s.Name == name {
			return s, true
		}
	}
	return Slot{}, false
}

// Bounds of what a start reads: the agent's own state files (topology,
// assignments, pool limits, a slot's secret and drain configuration), and
// a file of domains_dir, one domain as the control API sends it in one
// artifact (at most 1 MiB, manifest.MaxArtifactBytes).
const (
	maxStateFile  = 4 << 20
	maxDomainFile = 1 << 20
)

// LoadOrCreate returns the persisted topology, refusing a layout that differs
// from it; on first start it checks the planned topology for collisions
// (including ports already taken by another listener), creates every slot's
// directories and persists the topology atomically.
func LoadOrCreate(l Layout) (t Topology, created bool, err error) {
	want := Plan(l)
	path := filepath.Join(l.StateDir, topologyFile)
	data, err := sysfile.ReadFile(path, maxStateFile)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &t); err != nil {
			return Topology{}, false, fmt.Errorf("read topology %s: %w", path, err)
		}
		if err := t.matches(want); err != nil {
			return Topology{}, false, err
		}
		// Directories may have been removed by hand; recreate what is missing.
		return t, false, t.MakeDirs()
	case !os.IsNotExist(err):
		return Topology{}, false, fmt.Errorf("read topology: %w", err)
	}
	if err := want.Check(); err != nil {
		return Topology{}, false, err
	}
	if err := want.probePorts(l.Address); err != nil {
		return Topology{}, false, err
	}
	want.CreatedAt = time.Now().UTC()
	if err := os.MkdirAll(l.StateDir, 0o755); err != nil {
		return Topology{}, false, fmt.Errorf("create state dir: %w", err)
	}
	if err := want.MakeDirs(); err != nil {
		return Topology{}, false, err
	}
	out, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		return Topology{}, false, err
	}
	if err := atomicfile.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		return Topology{}, false, fmt.Errorf("persist topology: %w", err)
	}
	return want, true, nil
}

func (t Topology) matches(want Topology) error {
	if len(t.Slots) != len(want.Slots) {
		return fmt.Errorf("%w: this host has %d slots and the configuration asks for %d; the slot count cannot change (nothing was changed)",
			ErrTopologyChanged, len(t.Slots), len(want.Slots))
	}
	if t.HTTPBase != want.HTTPBase || t.HTTPSBase != want.HTTPSBase {
		return fmt.Errorf("%w: this host's ports start at http %d / https %d and the configuration asks for %d / %d (nothing was changed)",
			ErrTopologyChanged, t.HTTPBase, t.HTTPSBase, want.HTTPBase, want.HTTPSBase)
	}
	for i, s := range t.Slots {
		w := want.Slots[i]
		if s.Dir != w.Dir || s.RunDir != w.RunDir {
			return fmt.Errorf("%w: %s lives in %s and %s, the configuration asks for %s and %s (nothing was changed)",
				ErrTopologyChanged, s.Name, s.Dir, s.RunDir, w.Dir, w.RunDir)
		}
	}
	return nil
}

// probePorts refuses ports another listener already holds.
func (t Topology) probePorts(addr string) error {
	for _, s := range t.Slots {
		for _, port := range []int{s.HTTPPort, s.HTTPSPort} {
			ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("%w: port %d for %s is not free: %v", ErrCollision, port, s.Name, err)
			}
			ln.Close()
		}
	}
	return nil
}

// MakeDirs creates every slot's directories, its secret (once) and its
// drain include. The run directory is 0700: it holds the private socket.
func (t Topology) MakeDirs() error {
	for _, s := range t.Slots {
		for _, d := range []string{s.RuntimeDir(), filepath.Join(s.RuntimeDir(), "releases"), s.CacheDir(), s.RequestTmpDir(), s.LogsDir()} {
			if err := os.MkdirAll(d, 0o750); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		if err := os.MkdirAll(s.RunDir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", s.RunDir, err)
		}
		if err := os.Chmod(s.RunDir, 0o700); err != nil { // an older, wider one
			return err
		}
		if err := ensureSecret(s.SecretFile()); err != nil {
			return fmt.Errorf("secret of %s: %w", s.Name, err)
		}
		// The marker is the truth; the include follows it (a crash may have
		// come between writing the two).
		if err := syncDrainConf(s); err != nil {
			return err
		}
	}
	return nil
}

// EphemeralLow is the bottom of the kernel's ephemeral (client) port range,
// 32768 where it cannot be read. A listener inside that range can find its
// port taken by the local end of some outgoing connection.
func EphemeralLow() int {
	if b, err := sysfile.ReadFile("/proc/sys/net/ipv4/ip_local_port_range", 64); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 1024 {
				return lo
			}
		}
	}
	return 32768
}

// InEphemeralRange lists the slots' ports inside the kernel's ephemeral range.
func (t Topology) InEphemeralRange() []int {
	lo := EphemeralLow()
	var out []int
	for _, s := range t.Slots {
		for _, p := range []int{s.HTTPPort, s.HTTPSPort} {
			if p >= lo {
				out = append(out, p)
			}
		}
	}
	return out
}

// Own gives each slot's directories to the group of the slot's own user
// (gids by slot name; a slot without one is the agent's), for a cell that
// runs as that user (celluser): the slot's directory, its runtime and
// secret readable by the group (0750, 0640; what the agent writes there
// is 0644 for the cell to read), what the cell writes (cache, tmp, logs,
// its run directory: pid file and private socket) writable by it, sticky
// so that the cell cannot remove or replace the agent's files there
// (1770). No set-group-id directories: the unit's RestrictSUIDSGID
// refuses them, and the cell's own files have its group anyway. The agent is a member of each group. Entries the agent
// made there before (an agent that ran its cells as itself) are given to
// the group too; the state and run directories, and the one holding the
// slots', become traversable (0751) so the cell reaches its own, and only
// its own: every other entry in them is the agent's, secrets 0600. A slot
// without a gid gets the modes MakeDirs makes.
func (t Topology) Own(stateDir, runDir string, gids map[string]int) error {
	if len(gids) > 0 {
		for _, d := range []string{stateDir, filepath.Join(stateDir, "cells"), runDir} {
			if err := addMode(d, 0o001); err != nil {
				return err
			}
		}
	}
	for _, s := range t.Slots {
		gid, ok := gids[s.Name]
		if !ok {
			gid = -1
		}
		read, write, secret := os.FileMode(0o750), os.FileMode(0o750), os.FileMode(0o600)
		if ok {
			read, write, secret = 0o750, 0o770|os.ModeSticky, 0o640
		}
		for _, d := range []struct {
			path string
			mode os.FileMode
			tree os.FileMode // the group's bits on what is in it, the agent's (0: left)
		}{
			{s.Dir, read, 0}, {s.RuntimeDir(), read, 0o040},
			{s.CacheDir(), write, 0o060}, {s.TmpDir(), write, 0o060}, {s.RequestTmpDir(), write, 0o060},
			{s.LogsDir(), write, 0o060}, {s.RunDir, write, 0},
			{s.SecretFile(), secret, 0},
		} {
			mode := d.mode
			if d.path == s.RunDir && !ok {
				mode = 0o700
			}
			if err := own(d.path, gid, mode); err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			if d.tree != 0 && ok {
				if err := ownTree(d.path, gid, d.tree); err != nil {
					return fmt.Errorf("%s: %w", s.Name, err)
				}
			}
		}
	}
	return nil
}

// own sets path's group (gid -1: unchanged) and mode.
func own(path string, gid int, mode os.FileMode) error {
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			return err
		}
	}
	return os.Chmod(path, mode)
}

// addMode adds bits to a directory's mode.
func addMode(dir string, bits os.FileMode) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm()&bits == bits {
		return nil
	}
	return os.Chmod(dir, st.Mode()&(os.ModePerm|os.ModeSetgid|os.ModeSticky)|bits)
}

// ownTree gives what is under root, and is this process's own, to gid
// with the group's bits (0o040 read, 0o060 read and write; directories
// searchable too): once, while root's entries are not the group's yet.
// Entries of other users (a cell's own) are left.
func ownTree(root string, gid int, bits os.FileMode) error {
	ents, err := os.ReadDir(root)
	if err != nil || len(ents) == 0 {
		return err
	}
	uid := os.Geteuid()
	return filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return nil // gone meanwhile
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || int(st.Uid) != uid || int(st.Gid) == gid || info.Mode()&os.ModeSymlink != 0 {
			if e.IsDir() && ok && int(st.Uid) != uid {
				return fs.SkipDir
			}
			return nil
		}
		mode := info.Mode().Perm() | bits
		if e.IsDir() {
			mode |= 0o010
		}
		return own(path, gid, mode)
	})
}
