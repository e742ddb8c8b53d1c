package supervisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cellvisor/internal/procstat"
	"cellvisor/testkit/testutil"
)

func TestMismatch(t *testing.T) {
	want := masterRecord{Binary: "/usr/sbin/nginx", Conf: "/s/cell-01/runtime/current/nginx.conf", Cgroup: "/cv/cell-01"}
	rec := want
	rec.PID, rec.StartTicks = 4242, 777
	// nginx rewrites its title: the command line is one string with spaces.
	good := procIdentity{exe: "/usr/sbin/nginx", startTicks: 777,
		args: strings.Fields("nginx: master process /usr/sbin/nginx -p /s/cell-01/ -c /s/cell-01/runtime/current/nginx.conf -e /s/cell-01/logs/error.log")}
	other := good
	other.args = strings.Fields("nginx: master process /usr/sbin/nginx -p /s/cell-02/ -c /s/cell-02/runtime/current/nginx.conf")
	recycled := good
	recycled.startTicks = 778
	sleep := procIdentity{exe: "/usr/bin/sleep", startTicks: 777, args: []string{"sleep", "1000"}}
	upgraded := good // its binary was replaced at the same path (a package upgrade)
	upgraded.exe = "/usr/sbin/nginx (deleted)"
	otherDeleted := good
	otherDeleted.exe = "/usr/sbin/nginx.old (deleted)"
	prefix := good
	prefix.args = strings.Fields("nginx -c /s/cell-01/runtime/current/nginx.conf.old")
	otherRec := rec
	otherRec.Conf, otherRec.Cgroup = "/s/cell-02/runtime/current/nginx.conf", "/cv/cell-02"
	for _, tc := range []struct {
		name    string
		rec     masterRecord
		pidFile int
		members []int
		id      procIdentity
		want    string // "" to adopt, else a part of the reason
	}{
		{"the recorded master", rec, 4242, []int{4242, 4243}, good, ""},
		{"pid file and record disagree", rec, 4243, []int{4242, 4243}, good, "the pid file names 4243"},
		{"not in the slot's cgroup", rec, 4242, []int{4243}, good, "not in the cell's cgroup"},
		{"a recycled pid", rec, 4242, []int{4242}, recycled, "recycled"},
		{"an unrelated process", rec, 4242, []int{4242}, sleep, "runs /usr/bin/sleep"},
		{"its binary replaced at the same path", rec, 4242, []int{4242}, upgraded, ""},
		{"another binary, deleted", rec, 4242, []int{4242}, otherDeleted, "runs /usr/sbin/nginx.old (deleted)"},
		{"another slot's master", rec, 4242, []int{4242}, other, "does not name"},
		{"another slot's record", otherRec, 4242, []int{4242}, good, "not this slot's"},
		{"a conf path that only starts alike", rec, 4242, []int{4242}, prefix, "does not name"},
	} {
		got := mismatch(want, tc.rec, tc.pidFile, tc.members, tc.id)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// doomed reports what releaseSpare reads from one procstat.Fields: pid gone, a
// zombie, or killed.
func doomed(pid int) bool {
	f, err := procstat.Fields(pid)
	if err != nil {
		return os.IsNotExist(err) || errors.Is(err, syscall.ESRCH)
	}
	return procstat.Dead(f[0]) || killed(f)
}

// doomed: a running process is not; once SIGKILLed (pending, then exiting,
// then a zombie not yet reaped) it is, and so is a pid that names nothing.
// Between the kernel's taking the pending kill and its marking the process
// exiting (a short window, longer where a VM's CPU is preempted in it)
// /proc shows neither, and one CI run of this test read the killed process
// then. releaseSpare can read a spare so: the spare is released, exits at
// once, and its cell restarts as from any exit. Here the kill's reading is
// awaited, bounded.
func TestDoomedProcess(t *testing.T) {
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	pid := cmd.Process.Pid
	if doomed(pid) {
		t.Fatalf("running pid %d reads as doomed", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		if !doomed(pid) {
			return fmt.Errorf("pid %d, SIGKILLed and not reaped, does not read as doomed", pid)
		}
		return nil
	})
	_ = cmd.Wait()
	reaped = true
	if !doomed(pid) {
		t.Errorf("pid %d, reaped, does not read as doomed", pid)
	}
}

// watched starts `sleep 60` and watches it as an adopted master, through a
// pidfd as adopt opens one. The child is killed and reaped at cleanup.
func watched(t *testing.T) (*exec.Cmd, *proc) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	p, err := watchPidfd(cmd.Process.Pid, fd)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, p
}

// awaitDone waits for the watch of p to end, up to 10s.
func awaitDone(t *testing.T, p *proc) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end")
	}
}

// An adopted master's watch ends on its exit, signalled through the
// pidfd, and on release, which leaves it running; signals after the watch
// are refused rather than sent to a pid that may be another process's.
func TestWatchPidfd(t *testing.T) {
	t.Run("exit", func(t *testing.T) {
		_, p := watched(t)
		if err := p.signal(unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		awaitDone(t, p)
		if !errors.Is(p.err, errAdoptedExit) {
			t.Errorf("watch ended with %v, want %v", p.err, errAdoptedExit)
		}
		if err := p.signal(unix.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("signal after the exit: %v, want %v", err, os.ErrProcessDone)
		}
	})
	t.Run("exited before the watch", func(t *testing.T) {
		cmd := exec.Command("true")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Wait() })
		fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Skipf("no pidfd here: %v", err)
		}
		// A zombie (not reaped yet) by the time it is watched.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			t.Fatal(err)
		}
		p, err := watchPidfd(cmd.Process.Pid, fd)
		if err != nil {
			t.Fatal(err)
		}
		awaitDone(t, p)
		if !errors.Is(p.err, errAdoptedExit) {
			t.Errorf("watch ended with %v, want %v", p.err, errAdoptedExit)
		}
	})
	t.Run("release", func(t *testing.T) {
		cmd, p := watched(t)
		p.release()
		awaitDone(t, p)
		if !errors.Is(p.err, errReleased) {
			t.Errorf("watch ended with %v, want %v", p.err, errReleased)
		}
		if err := p.signal(unix.SIGKILL); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("signal after release: %v, want %v", err, os.ErrProcessDone)
		}
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil || info.Signo != 0 {
			t.Errorf("the released master is gone (%v, signo %d): release must leave it running", err, info.Signo)
		}
	})
}

// Watching adopted masters holds no thread: each watch is parked on the
// runtime's poller while its master runs.
func TestWatchPidfdHoldsNoThread(t *testing.T) {
	const n = 8
	for range n {
		_, p := watched(t)
		t.Cleanup(func() { p.release(); <-p.done })
	}
	awaitParked(t, "supervisor.(*proc).watch(", n)
}
