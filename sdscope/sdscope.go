// Package sdscope keeps the cells in a delegated transient systemd scope of
// their own (cellvisor-cells.scope), outside the agent's unit, so that a
// restart of the unit (systemctl restart, a crash with Restart=on-failure, a
// package upgrade) does not kill them. It creates the scope over D-Bus with a
// holder process (a scope needs a PID), finds it again by name, reads its
// cgroup from systemd's ControlGroup property, tells a stop job of the
// agent's unit from a restart job, and stops the holder when the cells stop
// for good. Only agent and cmd/cellvisor import it.
package sdscope

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// ErrNotFound says the scope is not running.
var ErrNotFound = errors.New("scope not running")

// UnderSystemd reports whether systemd started this process as a service:
// it sets INVOCATION_ID for every unit and NOTIFY_SOCKET for Type=notify.
// Whether the system bus answers is the caller's next question (Dial).
func UnderSystemd() bool {
	return os.Getenv("INVOCATION_ID") != "" || os.Getenv("NOTIFY_SOCKET") != ""
}

// ScopeName is the cells' scope of unit: "cellvisor.service" has
// "cellvisor-cells.scope" (an instance "cellvisor@a.service" has
// "cellvisor@a-cells.scope").
func ScopeName(unit string) string {
	base := unit
	if i := strings.LastIndexByte(unit, '.'); i > 0 {
		base = unit[:i]
	}
	return base + "-cells.scope"
}

// Conn talks to systemd over the system bus (DBUS_SYSTEM_BUS_ADDRESS, or
// its standard socket).
type Conn struct {
	c *sddbus.Conn
}

// Dial connects to the system bus and authenticates, bounded by ctx. The
// connection outlives ctx (godbus closes a connection when the context it
// was made with ends), until Close.
func Dial(ctx context.Context) (*Conn, error) {
	type result struct {
		c   *sddbus.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := sddbus.NewSystemConnectionContext(context.WithoutCancel(ctx))
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("connect to the system bus: %w", r.err)
		}
		return &Conn{c: r.c}, nil
	case <-ctx.Done():
		// A bus that hangs: the late connection, if any, is closed.
		go func() {
			if r := <-ch; r.err == nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("connect to the system bus: %w", ctx.Err())
	}
}

// Close closes the connection.
func (c *Conn) Close() { c.c.Close() }

// OwnUnit is the unit this process runs in.
func (c *Conn) OwnUnit(ctx context.Context) (string, error) {
	u, err := c.c.GetUnitNameByPID(ctx, uint32(os.Getpid()))
	if err != nil {
		return "", fmt.Errorf("ask systemd for this process's unit: %w", err)
	}
	return u, nil
}

// Scope is a running cells' scope.
type Scope struct {
	// Name is the unit name, e.g. cellvisor-cells.scope.
	Name string
	// ControlGroup is its cgroup relative to the mount, the same in every
	// hierarchy, e.g. /system.slice/cellvisor-cells.scope.
	ControlGroup string
}

// Find returns the running scope name, or ErrNotFound.
func (c *Conn) Find(ctx context.Context, name string) (Scope, error) {
	st, err := c.stringProp(ctx, name, "Unit", "ActiveState")
	if err != nil {
		return Scope{}, fmt.Errorf("find %s: %w", name, err)
	}
	if st != "active" {
		return Scope{}, fmt.Errorf("find %s: %w (state %q)", name, ErrNotFound, st)
	}
	cg, err := c.stringProp(ctx, name, "Scope", "ControlGroup")
	if err != nil {
		return Scope{}, fmt.Errorf("find %s: %w", name, err)
	}
	if err := checkCgroupPath(cg); err != nil {
		return Scope{}, fmt.Errorf("find %s: %w", name, err)
	}
	return Scope{Name: name, ControlGroup: cg}, nil
}

// checkCgroupPath refuses a ControlGroup that is not a clean absolute path
// below the root (systemd sends "" for a unit without a cgroup).
func checkCgroupPath(cg string) error {
	if cg == "" {
		return fmt.Errorf("%w: no control group", ErrNotFound)
	}
	if !strings.HasPrefix(cg, "/") || cg == "/" || strings.Contains(cg, "/../") || strings.HasSuffix(cg, "/..") || strings.Contains(cg, "//") {
		return fmt.Errorf("control group %q is not a cgroup below the root", cg)
	}
	return nil
}

// stringProp reads a string property of unit on interface
// org.freedesktop.systemd1.<iface>.
func (c *Conn) stringProp(ctx context.Context, unit, iface, name string) (string, error) {
	p, err := c.c.GetUnitTypePropertyContext(ctx, unit, iface, name)
	if err != nil {
		return "", fmt.Errorf("property %s.%s: %w", iface, name, err)
	}
	s, ok := p.Value.Value().(string)
	if !ok {
		return "", fmt.Errorf("property %s.%s: %s is not a string", iface, name, p.Value.Signature())
	}
	return s, nil
}

// Job types of a unit's job, as systemd names them.
const (
	JobStop       = "stop"
	JobRestart    = "restart"
	JobTryRestart = "try-restart"
)

// UnitJob returns the type of the job systemd runs for unit now, or "" when
// there is none (a plain kill).
func (c *Conn) UnitJob(ctx context.Context, unit string) (string, error) {
	jobs, err := c.c.ListJobsContext(ctx)
	if err != nil {
		return "", fmt.Errorf("list systemd jobs: %w", err)
	}
	for _, j := range jobs {
		if j.Unit == unit {
			return j.JobType, nil
		}
	}
	return "", nil
}

// KeepsCells reports whether a job of the agent's unit is one after which
// the unit runs again, so that its cells are to outlive the agent: a restart
// (systemd reports a try-restart of a running unit as restart too, and a
// Restart= after a failure involves no SIGTERM at all). A stop, no job at
// all (a plain kill) and anything else stop the cells.
func KeepsCells(jobType string) bool {
	switch jobType {
	case JobRestart, JobTryRestart:
		return true
	}
	return false
}

// isAccessDenied tells a refusal by the bus's or systemd's policy (polkit
// for a non-root caller) from other failures.
func isAccessDenied(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.DBus.Error.AccessDenied" || de.Name == "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
	}
	return false
}
