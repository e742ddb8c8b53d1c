package cgroup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/cgroup"
	"cellvisor/testkit/testutil"
)

// startStandby starts a standby of g for argv, with extra files of its own
// from fd 3; it is SIGKILLed and reaped when the test ends if it still runs.
func startStandby(t *testing.T, g cgroup.Group, out *bytes.Buffer, extra []*os.File, argv ...string) (*exec.Cmd, *cgroup.Standby, <-chan struct{}) {
	t.Helper()
	sg, ok := g.(cgroup.StandbyGroup)
	if !ok {
		t.Skip("standbys are for groups joined by a helper (cgroup v1)")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = extra
	sb, after, err := sg.PrepareStandby(cmd)
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Start()
	after(err == nil)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		sb.Close()
		_ = cmd.Process.Kill()
		<-exited
	})
	return cmd, sb, exited
}

// joinedAll waits until pid is in g's cgroup.procs in every hierarchy.
func joinedAll(t *testing.T, g cgroup.Group, pid int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		for c, p := range g.Paths() {
			data, err := os.ReadFile("/sys/fs/cgroup/" + c + p + "/cgroup.procs")
			if err != nil {
				return err
			}
			if !slices.Contains(strings.Fields(string(data)), strconv.Itoa(pid)) {
				return fmt.Errorf("pid %d not yet in %s's %s", pid, c, p)
			}
		}
		return nil
	})
}

// A standby joins the group before anything is exec'd, survives a kill of
// the rest of the group, and execs its program in place (same pid, inside
// the group, without the pipe's fd) when released.
func TestStandbyJoinsSurvivesKillExceptAndExecsInPlace(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-04", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd, sb, exited := startStandby(t, g, &out, nil, "/bin/sh", "-c", `cat /proc/self/cgroup; echo pid=$$; exec ls -l /proc/self/fd`)
	pid := cmd.Process.Pid
	joinedAll(t, g, pid)
	_, leftExited := testutil.StartIn(t, g, "/bin/sh", "-c", "sleep 1000 & wait")
	var left []int
	testutil.Eventually(t, 10*time.Second, func() error {
		pids, err := g.Procs()
		left = slices.DeleteFunc(pids, func(p int) bool { return p == pid })
		if err != nil || len(left) != 2 {
			return fmt.Errorf("want sh and sleep beside the standby, have %v (%v)", left, err)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.(cgroup.StandbyGroup).KillExcept(ctx, pid); err != nil {
		t.Fatal(err)
	}
	<-leftExited
	for _, p := range left {
		if testutil.Alive(p) {
			t.Errorf("pid %d survived KillExcept", p)
		}
	}
	if !testutil.Alive(pid) {
		t.Fatal("the standby did not survive KillExcept")
	}
	if l, err := g.Limits(); err != nil || l.PIDs != cellLimits.PIDs {
		t.Fatalf("pids limit after KillExcept: %+v, %v", l, err)
	}
	if err := sb.Release(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if !cmd.ProcessState.Success() {
		t.Fatalf("released program: %v\n%s", cmd.ProcessState, out.String())
	}
	got := out.String()
	if !strings.Contains(got, "pid="+strconv.Itoa(pid)+"\n") {
		t.Errorf("the program did not run in place of the standby (pid %d):\n%s", pid, got)
	}
	rel := strings.TrimPrefix(g.Path(), m.Path())
	for _, c := range []string{"memory", "cpu", "pids"} {
		found := false
		for _, line := range strings.Split(got, "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) == 3 && hasController(f[1], c) && strings.HasSuffix(f[2], rel) {
				found = true
			}
		}
		if !found {
			t.Errorf("controller %s: released program not in the group:\n%s", c, got)
		}
	}
	// ls opens its directory on the lowest free fd: 3, unless the
	// standby's pipe leaked into the program.
	if !strings.Contains(got, " 3 -> /proc/") {
		t.Errorf("fd 3 of the released program is not ls's own (the standby's pipe leaked?):\n%s", got)
	}
}

// A standby whose pipe is closed (the agent discards it, or exits) exits 0
// without running its program; one released after it is gone says so.
func TestStandbyClosedExitsWithoutExec(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-05", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	marker := t.TempDir() + "/ran"
	var out bytes.Buffer
	cmd, sb, exited := startStandby(t, g, &out, nil, "/bin/sh", "-c", "touch "+marker)
	joinedAll(t, g, cmd.Process.Pid)
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the standby did not exit once its pipe closed")
	}
	if !cmd.ProcessState.Success() {
		t.Errorf("standby exit: %v\n%s", cmd.ProcessState, out.String())
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the program ran though the standby was closed: %v", err)
	}
	if err := sb.Release(); err == nil {
		t.Error("releasing a closed standby succeeded")
	}
}

// A standby of a command with extra files of its own (a cell's listeners)
// reads its pipe after them: the released program keeps the command's fds
// 3 and 4 and has nothing of the pipe's.
func TestStandbyKeepsTheCommandsExtraFiles(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, err := m.Ensure("cell-06", cellLimits)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var files []*os.File
	for _, name := range []string{"a", "b"} {
		f, err := os.Create(dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	var out bytes.Buffer
	cmd, sb, exited := startStandby(t, g, &out, files, "/bin/sh", "-c", `readlink /proc/self/fd/3 /proc/self/fd/4; ls -l /proc/self/fd`)
	joinedAll(t, g, cmd.Process.Pid)
	if err := sb.Release(); err != nil {
		t.Fatal(err)
	}
	<-exited
	if !cmd.ProcessState.Success() {
		t.Fatalf("released program: %v\n%s", cmd.ProcessState, out.String())
	}
	lines := strings.Fields(out.String())
	if len(lines) < 2 || lines[0] != dir+"/a" || lines[1] != dir+"/b" {
		t.Errorf("fds 3 and 4 of the released program: %q, want its own files", lines)
	}
	// ls opens its directory on the lowest free fd: 5, unless the pipe
	// (passed as fd 5) leaked into the program.
	if !strings.Contains(out.String(), " 5 -> /proc/") {
		t.Errorf("fd 5 of the released program is not ls's own (the standby's pipe leaked?):\n%s", out.String())
	}
}

// Condemn kills a group's processes but the one kept and returns once
// every one of them has a SIGKILL pending (or is gone), with the pids limit
// restored: their teardown is not waited for, but none can run on.
func TestCondemnLeavesNoneRunning(t *testing.T) {
	m := testutil.RequireCgroups(t)
	g, pids, exited := shAndTwoSleeps(t, m, "cell-07")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cgroup.Condemn(ctx, g, 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		if testutil.Alive(p) && !killPending(p) {
			t.Errorf("pid %d runs on after Condemn, with no SIGKILL pending", p)
		}
	}
	if l, err := g.Limits(); err != nil || l.PIDs != cellLimits.PIDs {
		t.Fatalf("pids limit after Condemn: %+v, %v", l, err)
	}
	<-exited
	testutil.Eventually(t, 10*time.Second, func() error {
		if left, err := g.Procs(); err != nil || len(left) > 0 {
			return fmt.Errorf("left in the group: %v (%v)", left, err)
		}
		return nil
	})
}

// killPending reports whether pid has a SIGKILL pending (its shared
// pending set, where kill(2) puts it).
func killPending(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true // gone
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "ShdPnd:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&(1<<(9-1)) != 0
		}
	}
	return false
}
