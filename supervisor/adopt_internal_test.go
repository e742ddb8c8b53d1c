package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"cellvisor/internal/procstat"
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

// doomed: a running process is not; once SIGKILLed (pending, then a zombie
// not yet reaped) it is, and so is a pid that names nothing.
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
	if !doomed(pid) {
		t.Errorf("pid %d, SIGKILLed and not reaped, does not read as doomed", pid)
	}
	_ = cmd.Wait()
	reaped = true
	if !doomed(pid) {
		t.Errorf("pid %d, reaped, does not read as doomed", pid)
	}
}
