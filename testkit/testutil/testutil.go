// Package testutil holds what tests that need real parts share: checks that
// skip with the reason printed when this host lacks root, cgroups or
// OpenResty; a fresh cgroup subtree per test; free loopback port ranges.
// Only tests import it.
package testutil

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/runtime"
)

// RequireRoot skips unless the test runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates cgroups and runs cells); run as root to exercise this test")
	}
}

// RequireOpenResty skips unless an OpenResty-compatible binary is installed;
// it returns the binary and the dynamic modules it needs.
func RequireOpenResty(t testing.TB) (string, []string) {
	t.Helper()
	bin, mods, err := runtime.FindOpenResty()
	if err != nil {
		t.Skipf("needs OpenResty or nginx with the Lua module: %v (make deps installs it)", err)
	}
	return bin, mods
}

// RequireCgroups skips unless limits can be enforced here, and returns a
// manager for a fresh subtree below this process's cgroup that is removed
// (with anything left in it) when the test ends.
func RequireCgroups(t testing.TB) cgroup.Manager {
	t.Helper()
	RequireRoot(t)
	name := "cvtest-" + randHex(4)
	m, err := cgroup.New(cgroup.Options{Subtree: name})
	if err != nil {
		t.Fatalf("cgroups: %v", err)
	}
	if m.Mode() == cgroup.ModeUnenforced {
		t.Skipf("cell limits cannot be enforced on this host: %v", m.Reason())
	}
	t.Cleanup(func() { RemoveSubtree(t, m) })
	return m
}

// RemoveSubtree kills and removes every cell group in m, then the subtree.
func RemoveSubtree(t testing.TB, m cgroup.Manager) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names, err := m.List()
	if err != nil {
		t.Errorf("list cgroups: %v", err)
	}
	for _, n := range names {
		g, err := m.Open(n)
		if err == nil {
			err = g.Delete(ctx)
		}
		if err != nil {
			t.Errorf("remove cgroup %s: %v", n, err)
		}
	}
	if err := m.Remove(); err != nil {
		t.Errorf("remove cgroup subtree: %v", err)
	}
}

// PortBase returns a base port such that n consecutive ports from it are
// free on 127.0.0.1 now. Bases are drawn at random below the kernel's
// ephemeral port range (from 10000), so that packages testing in parallel
// rarely meet, and so that a cell's port never collides with the local port
// of a client connection (nginx would spend 2.5 s retrying its bind).
func PortBase(t testing.TB, n int) int {
	t.Helper()
	hi := runtime.EphemeralLow() - n
	for try := 0; try < 100; try++ {
		r, err := rand.Int(rand.Reader, big.NewInt(int64(hi-10000)))
		if err != nil {
			t.Fatal(err)
		}
		base := 10000 + int(r.Int64())
		if portsFree(base, n) {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports found", n)
	return 0
}

func portsFree(base, n int) bool {
	for p := base; p < base+n; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		ln.Close()
	}
	return true
}

func randHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// Eventually polls cond until it returns nil or the timeout passes, and
// fails the test with cond's last error. Use it to await a condition, never
// to wait a fixed time.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	delay := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		time.Sleep(delay)
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// Alive reports whether pid is a live (non-zombie) process.
func Alive(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	for i := len(st) - 1; i >= 0; i-- {
		if st[i] == ')' {
			return i+2 < len(st) && st[i+2] != 'Z' && st[i+2] != 'X'
		}
	}
	return false
}

// StartIn starts argv inside g. When the test ends the process (and anything
// else in g) is killed and reaped. The returned channel closes once it exited.
func StartIn(t testing.TB, g cgroup.Group, argv ...string) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cgroup.Start(g, cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Kill(ctx)
		_ = cmd.Process.Kill()
		<-exited
	})
	return cmd, exited
}

// GoBuild builds the Go package pkg (an import path, or a directory
// relative to the test's) into out as make build builds the shipped
// binaries: static (CGO_ENABLED=0), -trimpath, with ldflags (the agent's
// cgexec.LDFlags()). Integration tests run what an edge host runs.
func GoBuild(pkg, out string, ldflags ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", strings.Join(ldflags, " "), "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// Traversable makes dir, a t.TempDir, and the per-test directory above it
// (both 0700) traversable by other users (0751): a cell's own user reaches
// its slot's directories under them as it does a host's state directory.
func Traversable(t testing.TB, dir string) {
	t.Helper()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o751); err != nil {
			t.Fatal(err)
		}
	}
}
