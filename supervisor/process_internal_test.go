package supervisor

import (
	"context"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitExit reports a master's exit as cmd.Wait does: a clean exit, an
// exit status, a signal.
func TestWaitExitReportsTheExit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		kill   bool
		want   string
	}{
		{"clean", "exit 0", false, "exit status 0"},
		{"status", "exit 3", false, "exit status 3"},
		{"killed", "exec sleep 60", true, "killed by signal killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("/bin/sh", "-c", tc.script)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- waitExit(cmd) }()
			if tc.kill {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-done:
				if got := describeExit(err); got != tc.want {
					t.Errorf("exit %q, want %q", got, tc.want)
				}
				if cmd.ProcessState == nil {
					t.Error("the exit is not reaped (no ProcessState)")
				}
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("waitExit did not return after the exit")
			}
		})
	}
}

// Where no pidfd can be had (pidfd_open missing, or refusing the
// non-blocking flag: kernels before 5.10), or where the one had is not one
// the poller takes, the wait is cmd.Wait's: it still returns only once the
// master has exited, with its status.
func TestWaitExitWithoutAPollablePidfd(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(int, int) (int, error)
	}{
		{"no pidfd", func(int, int) (int, error) { return -1, syscall.EINVAL }},
		{"not pollable", func(int, int) (int, error) {
			return syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidfdOpen = tc.open
			t.Cleanup(func() { pidfdOpen = unix.PidfdOpen })
			cmd := exec.Command("sleep", "60")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- waitExit(cmd) }()
			select {
			case err := <-done:
				t.Fatalf("waitExit returned while the master ran: %v", err)
			default:
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if got := describeExit(err); got != "killed by signal killed" {
					t.Errorf("exit %q, want killed by signal killed", got)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waitExit did not return after the exit")
			}
		})
	}
}

// While masters run, waiting for them holds no thread: each wait is parked
// on the runtime's poller ("IO wait"), where cmd.Wait alone would sit in a
// system call, on a thread of its own, for the master's whole life.
func TestWaitExitHoldsNoThread(t *testing.T) {
	const n = 8
	var cmds []*exec.Cmd
	done := make(chan error, n)
	for range n {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
		go func() { done <- waitExit(cmd) }()
	}
	t.Cleanup(func() {
		for _, cmd := range cmds {
			_ = cmd.Process.Kill()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for range cmds {
			select {
			case <-done:
			case <-ctx.Done():
				t.Error("a wait did not end after its child was killed")
				return
			}
		}
	})
	awaitParked(t, "supervisor.waitExit(", n)
}

// awaitParked waits, up to 10s, until n goroutines with fn on their stack
// are parked on the runtime's poller, and fails the test if they never are.
func awaitParked(t *testing.T, fn string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		polled, inSyscall := parkStates(fn)
		if polled == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d waits parked on the poller, %d in a system call (a thread each)", polled, n, inSyscall)
		case <-tick.C:
		}
	}
}

// parkStates counts the goroutines whose stack has fn parked on the
// runtime's poller, and those in a system call.
func parkStates(fn string) (polled, inSyscall int) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, fn) {
			continue
		}
		header, _, _ := strings.Cut(g, "\n")
		switch {
		case strings.Contains(header, "[IO wait"):
			polled++
		case strings.Contains(header, "[syscall"):
			inSyscall++
		}
	}
	return polled, inSyscall
}
