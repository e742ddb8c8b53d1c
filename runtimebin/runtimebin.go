// Package runtimebin tells which OpenResty (or nginx) binary a path holds
// now: the file's identity, which a package upgrade changes by renaming a
// new file over the old one, and the version the binary reports (-v); and
// it checks a binary against a cell's configuration (-t) before any cell
// runs it. It starts no cell. Only supervisor imports it.
package runtimebin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// ID is a file's identity: a rename of another file over the path, or a
// rewrite in place, changes it.
type ID struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
}

// Stat is the identity of the file at path (links followed, as exec does).
// For /proc/PID/exe it is the file the process runs, replaced or not.
func Stat(path string) (ID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return ID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ID{}, fmt.Errorf("stat %s: no device and inode", path)
	}
	return ID{Dev: st.Dev, Ino: st.Ino, Size: fi.Size(), MTime: fi.ModTime().UnixNano()}, nil
}

// ErrVersion marks a binary that does not say its version as nginx does.
var ErrVersion = errors.New("no nginx version in the binary's -v output")

// maxOutput bounds what is kept of a binary's output.
const maxOutput = 16 << 10

// Version runs "path -v" and returns what it names ("nginx/1.22.1",
// "openresty/1.25.3.1").
func Version(ctx context.Context, path string) (string, error) {
	out, err := run(ctx, exec.CommandContext(ctx, path, "-v"))
	if err != nil {
		return "", fmt.Errorf("%s -v: %w", path, err)
	}
	v, ok := parseVersion(out)
	if !ok {
		return "", fmt.Errorf("%s -v: %w: %q", path, ErrVersion, firstLine(out))
	}
	return v, nil
}

// parseVersion reads "nginx version: nginx/1.22.1" (or openresty's) from
// -v's output.
func parseVersion(out string) (string, bool) {
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "nginx version: "); ok {
			if f := strings.Fields(v); len(f) > 0 && strings.Contains(f[0], "/") {
				return f[0], true
			}
		}
	}
	return "", false
}

// Test is one -t run: the binary checks a cell's configuration as that
// cell would load it (with its prefix, configuration and error log),
// loading its modules too, and exits.
type Test struct {
	Binary   string
	Prefix   string // the cell's directory, "-p"
	Conf     string // its nginx.conf, "-c"
	ErrorLog string // its error log, "-e"
	// Credential runs the test as the cell's user (its files are
	// readable and writable as that user); nil for the caller's.
	Credential *syscall.Credential
	// As, where set, signals the test's processes as their user (an agent
	// that may switch to the cell's user but has no CAP_KILL cannot signal
	// another user's processes as itself).
	As func(func() error) error
}

// ErrTest marks a configuration the binary refused.
var ErrTest = errors.New("the binary refuses the configuration")

// Run runs the test; its error says what the binary printed.
func (t Test) Run(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, t.Binary, "-t", "-q", "-p", t.Prefix, "-c", t.Conf, "-e", t.ErrorLog)
	cmd.Dir = t.Prefix
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: t.Credential}
	out, err := runAs(ctx, cmd, t.As)
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if ctx.Err() == nil && errors.As(err, &ee) {
		return fmt.Errorf("%s -t -c %s: %w: %s", t.Binary, t.Conf, ErrTest, firstLine(out))
	}
	return fmt.Errorf("%s -t -c %s: %w", t.Binary, t.Conf, err)
}

// run runs cmd and returns its output (stdout and stderr, bounded); ctx
// ends it (the whole process group, where it has one) and WaitDelay bounds
// the wait for its output after that.
func run(ctx context.Context, cmd *exec.Cmd) (string, error) { return runAs(ctx, cmd, nil) }

// runAs is run, ending cmd through as where set.
func runAs(ctx context.Context, cmd *exec.Cmd, as func(func() error) error) (string, error) {
	var buf limited
	cmd.Stdout, cmd.Stderr = &buf, &buf
	cmd.WaitDelay = 2 * time.Second
	cmd.Cancel = func() error {
		kill := func() error {
			if cmd.SysProcAttr != nil && cmd.SysProcAttr.Setpgid {
				return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			}
			return cmd.Process.Kill()
		}
		if as != nil {
			return as(kill)
		}
		return kill()
	}
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return buf.String(), err
}

// firstLine is the first non-empty line of out, for an error.
func firstLine(out string) string {
	for line := range strings.Lines(out) {
		if l := strings.TrimSpace(line); l != "" {
			return l
		}
	}
	return "(no output)"
}

// limited keeps the first maxOutput bytes written to it.
type limited struct{ bytes.Buffer }

func (l *limited) Write(p []byte) (int, error) {
	if room := maxOutput - l.Len(); room > 0 {
		l.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
