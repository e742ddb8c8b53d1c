// Package fakesystemd is for tests only: a private D-Bus daemon on a unix
// socket in a temporary directory, and a small fake of systemd's
// org.freedesktop.systemd1 service on it that does what the agent asks of
// systemd (package sdscope): StartTransientUnit of a delegated scope (its
// cgroup directories created on the real hierarchies and the given PIDs
// moved in), StopUnit, GetUnitByPID, the ActiveState, Slice and
// ControlGroup properties, and the unit jobs that ListJobs reports (which a
// test sets, to play a stop or a restart). Nothing outside tests imports it.
package fakesystemd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// busConfig lets every local user own and call anything: the bus is the
// test's own.
const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`

// StartBus starts a private dbus-daemon for t and returns its address; the
// daemon is killed and reaped when t ends. It skips t when dbus-daemon is
// not installed (Debian package dbus, make deps).
func StartBus(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skipf("needs dbus-daemon (Debian package dbus; make deps): %v", err)
	}
	dir, err := os.MkdirTemp("", "cvbus-") // short: a unix socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(busConfig, filepath.Join(dir, "bus"))), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config-file="+conf, "--nofork", "--nopidfile", "--print-address=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	errLog, err := os.Create(filepath.Join(dir, "bus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errLog // shown if the test fails
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dbus-daemon: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		errLog.Close()
		if t.Failed() {
			b, _ := os.ReadFile(errLog.Name())
			t.Logf("dbus-daemon:\n%s", b)
		}
	})
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		addr <- strings.TrimSpace(line)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	select {
	case a := <-addr:
		if a == "" {
			t.Fatal("dbus-daemon printed no address")
		}
		return a
	case <-ctx.Done():
		t.Fatal("dbus-daemon printed no address within 10s")
	}
	return ""
}
