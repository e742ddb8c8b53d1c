package cgroup

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/cgexec"
)

// helperEnv switches the test binary into a helper process (TestMain).
const helperEnv = "CELLVISOR_CGROUP_TEST_HELPER"

// nobody is the unprivileged user the agent helper runs as.
const nobody = 65534

// helperLimits are a cell's limits in the handover test: small enough that
// a few forks hit the pids limit.
var helperLimits = Limits{MemoryBytes: 64 << 20, CPUQuotaUS: 20000, CPUPeriodUS: 100000, PIDs: 8}

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "prepare": // as root, inside the unit-like cgroups
		dirs, err := PrepareV1(PrepareOptions{UID: nobody, GID: nobody})
		exitHelper(dirs, err)
	case "agent": // as nobody, inside the unit-like cgroups
		exitHelper(agentHelper())
	}
	os.Exit(2)
}

func exitHelper(v any, err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(v)
	os.Exit(0)
}

// agentResult is what the unprivileged agent helper saw and did.
type agentResult struct {
	Mode   Mode   `json:"mode"`
	Reason string `json:"reason,omitempty"`
	PID    int    `json:"pid,omitempty"` // the cell's first process
}

// agentHelper does what a non-root agent does on start: detect the layout
// in its own (delegated) cgroup, create a cell group with limits and start
// a cell in it; the cell forks more processes than its pids limit allows.
func agentHelper() (agentResult, error) {
	m, err := New(Options{})
	if err != nil {
		return agentResult{}, err
	}
	res := agentResult{Mode: m.Mode()}
	if m.Mode() != ModeV1Hybrid {
		res.Reason = fmt.Sprint(m.Reason())
		return res, nil
	}
	g, err := m.Ensure("cell-01", helperLimits)
	if err != nil {
		return res, err
	}
	// The forks run in a subshell, which the first refused fork ends; the
	// cell's own process then stays as a sleep.
	cmd := exec.Command("/bin/sh", "-c", `(for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 1000 & done); exec sleep 1000`)
	if err := Start(g, cmd); err != nil {
		return res, err
	}
	res.PID = cmd.Process.Pid
	return res, nil
}

// The privileged step hands a fresh unit-like v1 subtree to nobody, and only
// then can an agent running as nobody create a cell there whose limits are
// set (the kernel's files say so) and enforced (forks past pids.max fail),
// with the cell's process inside it. Nothing else changes owner.
func TestPrepareV1HandsSubtreeToUnprivilegedAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (creates cgroups and runs the prepare step as root)")
	}
	if kind, err := detect("/sys/fs/cgroup"); err != nil || kind != kindV1 {
		t.Skipf("needs a hybrid (v1 controllers) cgroup host: layout %v, %v", kind, err)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skipf("needs setpriv (util-linux) to run the agent as nobody: %v", err)
	}
	self, err := readSelf(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "cvprep-" + hex.EncodeToString(b)
	// The unit's cgroup: a fresh subtree below this process's own.
	unit, err := newV1("/sys/fs/cgroup", self, name, "")
	if err != nil {
		t.Skipf("cannot create v1 cgroups here: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if g, err := unit.Open("cell-01"); err == nil {
			if err := g.Delete(ctx); err != nil {
				t.Errorf("remove cell-01: %v", err)
			}
		}
		for _, c := range unit.ctrls {
			if err := removeDir(ctx, unit.dir(c, "")); err != nil {
				t.Errorf("remove unit cgroup: %v", err)
			}
		}
	})
	bin := exposedBinary(t)
	systemdDir := filepath.Join("/sys/fs/cgroup/systemd", self["name=systemd"])
	systemdBefore := owner(t, systemdDir)

	// inUnit runs argv as a process that first joins the unit's cgroups.
	inUnit := func(mode string, argv ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var procs []string
		for _, c := range unit.ctrls {
			procs = append(procs, join(unit.dir(c, ""), "cgroup.procs"))
		}
		path, args := cgexec.Join(nil, procs, argv)
		cmd := exec.CommandContext(ctx, path)
		cmd.Args = args
		cmd.Env = append(os.Environ(), helperEnv+"="+mode)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = 5 * time.Second
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if err != nil {
			err = fmt.Errorf("%s helper: %w: %s", mode, err, errOut.String())
		}
		return out.String(), err
	}
	asNobody := []string{setpriv, "--reuid=" + strconv.Itoa(nobody), "--regid=" + strconv.Itoa(nobody), "--clear-groups", bin}

	// Without the step, nobody cannot enforce anything there.
	out, err := inUnit("agent", asNobody...)
	if err != nil {
		t.Fatal(err)
	}
	var before agentResult
	decode(t, out, &before)
	if before.Mode != ModeUnenforced {
		t.Fatalf("before the handover the unprivileged agent got mode %s, want unenforced", before.Mode)
	}
	t.Logf("before the handover: %s (%s)", before.Mode, before.Reason)

	out, err = inUnit("prepare", bin)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	decode(t, out, &dirs)
	if len(dirs) != len(unit.ctrls) {
		t.Errorf("handed over %v, want one directory per controller %v", dirs, unit.ctrls)
	}
	for _, c := range unit.ctrls {
		d := unit.dir(c, "")
		for _, f := range []string{"", "cgroup.procs", "tasks"} {
			if uid := owner(t, join(d, f)); uid != nobody {
				t.Errorf("%s/%s owned by %d, want %d", d, f, uid, nobody)
			}
		}
	}
	for _, f := range []string{"memory/memory.limit_in_bytes", "pids/pids.max", "cpu/cpu.cfs_quota_us"} {
		c, file, _ := strings.Cut(f, "/")
		if uid := owner(t, join(unit.dir(c, ""), file)); uid != 0 {
			t.Errorf("the unit's own %s was handed over (owner %d): the agent could lift its unit's limits", f, uid)
		}
	}
	if got := owner(t, systemdDir); got != systemdBefore {
		t.Errorf("name=systemd cgroup %s changed owner %d -> %d", systemdDir, systemdBefore, got)
	}

	out, err = inUnit("agent", asNobody...)
	if err != nil {
		t.Fatal(err)
	}
	var after agentResult
	decode(t, out, &after)
	if after.Mode != ModeV1Hybrid || after.PID == 0 {
		t.Fatalf("after the handover the unprivileged agent got %+v, want v1-hybrid and a cell", after)
	}
	cell := func(c, f string) string { return join(unit.dir(c, "cell-01"), f) }
	want := map[string]string{
		cell("memory", "memory.limit_in_bytes"): "67108864",
		cell("cpu", "cpu.cfs_quota_us"):         "20000",
		cell("cpu", "cpu.cfs_period_us"):        "100000",
		cell("pids", "pids.max"):                "8",
	}
	for f, v := range want {
		if got := readTrim(t, f); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
	if uid := owner(t, unit.dir("memory", "cell-01")); uid != nobody {
		t.Errorf("cell cgroup owned by %d, want the agent's user %d", uid, nobody)
	}
	// The helper returned once the cell's join helper was exec'd; the cell
	// runs its command only once the helper has joined every hierarchy.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for wait := pollBackoff(); ; {
		own := readTrim(t, "/proc/"+strconv.Itoa(after.PID)+"/cgroup")
		var missing []string
		for _, c := range unit.ctrls {
			if !strings.Contains(own+"\n", ":"+c+":"+unit.base[c]+"/cell-01\n") {
				missing = append(missing, c+":"+unit.base[c]+"/cell-01")
			}
		}
		if len(missing) == 0 {
			break
		}
		if wait.Wait(ctx) != nil {
			t.Fatalf("the cell's process is not in %v:\n%s", missing, own)
		}
	}
	// Enforced: the cell tried 13 processes under a limit of 8.
	g, err := unit.Open("cell-01")
	if err != nil {
		t.Fatal(err)
	}
	var u Usage
	for wait := pollBackoff(); ; {
		if u, err = g.Usage(); err != nil {
			t.Fatal(err)
		}
		if u.PIDsRefused > 0 || wait.Wait(ctx) != nil {
			break
		}
	}
	if u.PIDsRefused == 0 || u.PIDs > uint64(helperLimits.PIDs) {
		t.Errorf("pids %d (limit %d), %d forks refused: want the limit held and forks refused", u.PIDs, u.PIDsLimit, u.PIDsRefused)
	}
	t.Logf("after the handover: cell-01 as uid %d holds %d pids, %d forks refused", nobody, u.PIDs, u.PIDsRefused)
}

// exposedBinary copies the test binary where nobody may run it.
func exposedBinary(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvprep-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "cgroup.test")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

func owner(t *testing.T, p string) int {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func decode(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("helper output %q: %v", s, err)
	}
}

func TestUnitCgroup(t *testing.T) {
	cases := []struct {
		name, path, want string
		wantErr          bool
	}{
		{name: "the unit's cgroup", path: "/system.slice/cellvisor.service", want: "/system.slice/cellvisor.service"},
		{name: "a delegated unit's control process", path: "/system.slice/cellvisor.service/.control", want: "/system.slice/cellvisor.service"},
		{name: "the hierarchy's root", path: "/", wantErr: true},
		{name: "control child of the root", path: "/.control", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := unitCgroup(selfPaths{"memory": tc.path}, "memory")
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("unitCgroup(%q) = %q, %v; want %q, error %v", tc.path, got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := unitCgroup(selfPaths{}, "pids"); err == nil {
		t.Error("unitCgroup without a pids line: want an error")
	}
}

func TestPrepareV1RefusesRootUser(t *testing.T) {
	if _, err := PrepareV1(PrepareOptions{Root: t.TempDir(), UID: 0, GID: 0}); err == nil || !strings.Contains(err.Error(), "non-root") {
		t.Errorf("PrepareV1 for uid 0 = %v, want a refusal", err)
	}
}
