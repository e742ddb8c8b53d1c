package fakesystemd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
	"golang.org/x/sys/unix"
)

const (
	busName      = "org.freedesktop.systemd1"
	managerPath  = dbus.ObjectPath("/org/freedesktop/systemd1")
	managerIface = "org.freedesktop.systemd1.Manager"
	unitPrefix   = "/org/freedesktop/systemd1/unit"
	jobPrefix    = "/org/freedesktop/systemd1/job"
)

// Options configures Start.
type Options struct {
	// Address is the bus (StartBus).
	Address string
	// Unit is what GetUnitByPID answers for any process: the agent's unit.
	Unit string
	// Slice is the unit's slice, e.g. "cvtest1234.slice" (no dashes: the
	// fake puts a slice directly below the root).
	Slice string
	// Root is the cgroup filesystem mount, or "" for /sys/fs/cgroup.
	Root string
}

// Systemd is the fake service.
type Systemd struct {
	o    Options
	conn *dbus.Conn

	mu      sync.Mutex // guards the following fields
	units   map[string]*unit
	jobs    map[string]string // unit -> job type set by the test
	nextJob uint32
	calls   []string
}

type unit struct {
	name   string
	active bool
	cgroup string
	slice  string
}

// Start connects to the bus, takes systemd's name and serves until t ends;
// then it stops every scope it created (killing what is left in it and
// removing its cgroup directories) and closes its connection.
func Start(t testing.TB, o Options) *Systemd {
	t.Helper()
	if o.Root == "" {
		o.Root = "/sys/fs/cgroup"
	}
	conn, err := dbus.Connect(o.Address)
	if err != nil {
		t.Fatalf("fake systemd: connect: %v", err)
	}
	s := &Systemd{o: o, conn: conn, units: map[string]*unit{}, jobs: map[string]string{}}
	s.units[o.Unit] = &unit{name: o.Unit, active: true, slice: o.Slice, cgroup: "/" + o.Slice + "/" + o.Unit}
	m := &manager{s}
	for path, v := range map[dbus.ObjectPath]any{managerPath: m} {
		if err := conn.Export(v, path, managerIface); err != nil {
			t.Fatal(err)
		}
	}
	if err := conn.ExportSubtree(&props{s}, unitPrefix, "org.freedesktop.DBus.Properties"); err != nil {
		t.Fatal(err)
	}
	reply, err := conn.RequestName(busName, dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("fake systemd: request name: %v %v", reply, err)
	}
	t.Cleanup(func() {
		s.mu.Lock()
		var scopes []*unit
		for _, u := range s.units {
			if strings.HasSuffix(u.name, ".scope") && u.cgroup != "" {
				scopes = append(scopes, u)
			}
		}
		s.mu.Unlock()
		for _, u := range scopes {
			if err := s.removeScope(u); err != nil {
				t.Errorf("fake systemd: clean up %s: %v", u.name, err)
			}
		}
		for _, d := range s.dirs("/" + o.Slice) {
			_ = os.Remove(d)
		}
		conn.Close()
	})
	return s
}

// Disconnect leaves the bus: systemd no longer answers (the bus says the
// service is unknown), as when the bus or systemd cannot be reached.
func (s *Systemd) Disconnect() {
	_, _ = s.conn.ReleaseName(busName)
	s.conn.Close()
}

// SetJob makes ListJobs report a running job of type jobType ("stop",
// "restart") for unit, or none when jobType is "".
func (s *Systemd) SetJob(unit, jobType string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if jobType == "" {
		delete(s.jobs, unit)
		return
	}
	s.jobs[unit] = jobType
}

// Scope returns the named scope's cgroup and whether it is active.
func (s *Systemd) Scope(name string) (cgroup string, active bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u, ok := s.units[name]
	if !ok {
		return "", false
	}
	return u.cgroup, u.active
}

// Calls lists the manager methods called, in order.
func (s *Systemd) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *Systemd) called(m string) {
	s.mu.Lock()
	s.calls = append(s.calls, m)
	s.mu.Unlock()
}

// dirs are cg's directories in the hierarchies systemd would realise a
// delegated unit in (and the agent uses): the unified one and the v1
// memory, cpu, cpuacct and pids ones. Never name=systemd: the host's.
func (s *Systemd) dirs(cg string) []string {
	var st unix.Statfs_t
	if err := unix.Statfs(s.o.Root, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return []string{filepath.Join(s.o.Root, cg)}
	}
	var out []string
	for _, h := range []string{"unified", "memory", "cpu", "cpuacct", "pids"} {
		if fi, err := os.Lstat(filepath.Join(s.o.Root, h)); err == nil && fi.IsDir() {
			out = append(out, filepath.Join(s.o.Root, h, cg))
		}
	}
	return out
}

// createScope realises a scope: its directories, controllers for it on a
// v2 host (Delegate=yes), and pids moved in.
func (s *Systemd) createScope(name, slice string, pids []uint32) (*unit, error) {
	cg := "/" + slice + "/" + name
	v2 := len(s.dirs(cg)) == 1 && !strings.Contains(s.dirs(cg)[0], "/unified/")
	for _, d := range s.dirs(cg) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		if v2 {
			for _, p := range []string{s.o.Root, filepath.Join(s.o.Root, slice)} {
				if err := os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+memory +cpu +pids"), 0); err != nil {
					return nil, fmt.Errorf("enable controllers in %s: %w", p, err)
				}
			}
		}
		for _, pid := range pids {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(int(pid))), 0); err != nil {
				return nil, fmt.Errorf("move %d into %s: %w", pid, d, err)
			}
		}
	}
	return &unit{name: name, active: true, cgroup: cg, slice: slice}, nil
}

// removeScope kills everything in the scope's cgroups (every level) and
// removes them, deepest first.
func (s *Systemd) removeScope(u *unit) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var errs []error
	for _, d := range s.dirs(u.cgroup) {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			if err := killAll(ctx, all[i]); err != nil {
				errs = append(errs, err)
			}
			if err := os.Remove(all[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	s.mu.Lock()
	u.active = false
	u.cgroup = ""
	s.mu.Unlock()
	return errors.Join(errs...)
}

// killAll SIGKILLs the processes in dir until none is left, bounded by ctx.
func killAll(ctx context.Context, dir string) error {
	for {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: processes left: %s", dir, strings.Fields(string(b)))
		case <-t.C:
		}
	}
}

// finishJob answers a job's caller: a JobRemoved signal, as systemd sends
// when the job is done.
func (s *Systemd) finishJob(unitName, result string) dbus.ObjectPath {
	s.mu.Lock()
	s.nextJob++
	id := s.nextJob
	s.mu.Unlock()
	path := dbus.ObjectPath(jobPrefix + "/" + strconv.Itoa(int(id)))
	go func() {
		_ = s.conn.Emit(managerPath, managerIface+".JobRemoved", id, path, unitName, result)
	}()
	return path
}

func unitPath(name string) dbus.ObjectPath {
	return dbus.ObjectPath(unitPrefix + "/" + sddbus.PathBusEscape(name))
}

// manager is org.freedesktop.systemd1.Manager.
type manager struct{ s *Systemd }

type property struct {
	Name  string
	Value dbus.Variant
}

type auxUnit struct {
	Name  string
	Props []property
}

func (m *manager) GetUnitByPID(pid uint32) (dbus.ObjectPath, *dbus.Error) {
	m.s.called("GetUnitByPID")
	return unitPath(m.s.o.Unit), nil
}

func (m *manager) StartTransientUnit(name, mode string, props []property, aux []auxUnit) (dbus.ObjectPath, *dbus.Error) {
	m.s.called("StartTransientUnit " + name)
	if !strings.HasSuffix(name, ".scope") {
		return "", dbus.MakeFailedError(fmt.Errorf("fake systemd: only scopes, not %s", name))
	}
	var slice string
	var pids []uint32
	delegate := false
	for _, p := range props {
		switch p.Name {
		case "Slice":
			slice, _ = p.Value.Value().(string)
		case "PIDs":
			pids, _ = p.Value.Value().([]uint32)
		case "Delegate":
			delegate, _ = p.Value.Value().(bool)
		}
	}
	if !delegate || slice == "" || len(pids) == 0 {
		return "", dbus.MakeFailedError(fmt.Errorf("fake systemd: a delegated scope in a slice with PIDs, got Delegate=%v Slice=%q PIDs=%v", delegate, slice, pids))
	}
	m.s.mu.Lock()
	if u, ok := m.s.units[name]; ok && u.active {
		m.s.mu.Unlock()
		return "", &dbus.Error{Name: "org.freedesktop.systemd1.UnitExists", Body: []any{"Unit " + name + " already exists."}}
	}
	m.s.mu.Unlock()
	u, err := m.s.createScope(name, slice, pids)
	if err != nil {
		return "", dbus.MakeFailedError(err)
	}
	m.s.mu.Lock()
	m.s.units[name] = u
	m.s.mu.Unlock()
	return m.s.finishJob(name, "done"), nil
}

func (m *manager) StopUnit(name, mode string) (dbus.ObjectPath, *dbus.Error) {
	m.s.called("StopUnit " + name)
	m.s.mu.Lock()
	u, ok := m.s.units[name]
	m.s.mu.Unlock()
	if ok && u.cgroup != "" && strings.HasSuffix(name, ".scope") {
		if err := m.s.removeScope(u); err != nil {
			return "", dbus.MakeFailedError(err)
		}
	}
	return m.s.finishJob(name, "done"), nil
}

type jobStatus struct {
	ID       uint32
	Unit     string
	JobType  string
	Status   string
	JobPath  dbus.ObjectPath
	UnitPath dbus.ObjectPath
}

func (m *manager) ListJobs() ([]jobStatus, *dbus.Error) {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	var out []jobStatus
	id := uint32(1000)
	for u, typ := range m.s.jobs {
		id++
		out = append(out, jobStatus{ID: id, Unit: u, JobType: typ, Status: "running",
			JobPath: dbus.ObjectPath(jobPrefix + "/" + strconv.Itoa(int(id))), UnitPath: unitPath(u)})
	}
	return out, nil
}

// props is org.freedesktop.DBus.Properties for every unit path; a unit the
// fake does not know reads as inactive, with no cgroup, as systemd answers
// for a unit that is not loaded.
type props struct{ s *Systemd }

func (p *props) unit(msg dbus.Message) *unit {
	path, _ := msg.Headers[dbus.FieldPath].Value().(dbus.ObjectPath)
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	for name, u := range p.s.units {
		if unitPath(name) == path {
			c := *u
			return &c
		}
	}
	return &unit{}
}

func (p *props) all(u *unit) map[string]dbus.Variant {
	state := "inactive"
	if u.active {
		state = "active"
	}
	return map[string]dbus.Variant{
		"Id":           dbus.MakeVariant(u.name),
		"ActiveState":  dbus.MakeVariant(state),
		"ControlGroup": dbus.MakeVariant(u.cgroup),
		"Slice":        dbus.MakeVariant(u.slice),
	}
}

func (p *props) Get(msg dbus.Message, iface, name string) (dbus.Variant, *dbus.Error) {
	v, ok := p.all(p.unit(msg))[name]
	if !ok {
		return dbus.Variant{}, &dbus.Error{Name: "org.freedesktop.DBus.Error.UnknownProperty", Body: []any{"unknown property " + iface + "." + name}}
	}
	return v, nil
}

func (p *props) GetAll(msg dbus.Message, iface string) (map[string]dbus.Variant, *dbus.Error) {
	return p.all(p.unit(msg)), nil
}
