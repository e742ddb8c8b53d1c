package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// A cell with ports is started holding them as the agent hands them over:
// listening sockets from fd 3 on, named by NGINX, that accept before the
// cell does anything with them.
func TestStartHandsHeldPortsOver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	out := filepath.Join(t.TempDir(), "out")
	script := `{ echo "$NGINX"; [ -S /proc/self/fd/3 ] && echo socket; } > "$1"; exec sleep 60`
	cmd, err := start(cell{Argv: []string{"/bin/sh", "-c", script, "cell", out}, Listen: []address{{"127.0.0.1", port}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	testutil.Eventually(t, 10*time.Second, func() error {
		data, err := os.ReadFile(out)
		if err != nil {
			return err
		}
		if got := string(data); got != "3;\nsocket\n" {
			return &unexpected{got}
		}
		return nil
	})
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		t.Fatalf("the held port does not accept: %v", err)
	}
	c.Close()
}

type unexpected struct{ got string }

func (u *unexpected) Error() string { return "the cell saw " + strings.TrimSpace(u.got) }

// A port another process holds is an error, before anything starts.
func TestStartRefusesAPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	_, err = start(cell{Argv: []string{"/bin/true"}, Listen: []address{{"127.0.0.1", port}}})
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("start on a held port: %v, want an error naming it", err)
	}
}
