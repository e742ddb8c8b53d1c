package cgexec_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/cgexec"
	"cellvisor/cgroup"
	"cellvisor/testkit/testutil"
)

var (
	probeOnce sync.Once
	probeDir  string
	probeBin  string
	probeErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if probeDir != "" {
		os.RemoveAll(probeDir)
	}
	os.Exit(code)
}

// probe builds testdata/probe linked with LDFlags once: a binary that
// carries the built-in helper, as the agent does.
func probe(t *testing.T) string {
	t.Helper()
	if !cgexec.Supported {
		t.Skip("this platform has no built-in helper: the shell is used")
	}
	probeOnce.Do(func() {
		if probeDir, probeErr = os.MkdirTemp("", "cgexec-probe-"); probeErr == nil {
			probeBin = filepath.Join(probeDir, "probe")
			probeErr = testutil.GoBuild("./testdata/probe", probeBin, cgexec.LDFlags())
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeBin
}

// helper is one implementation of the helper: the shell, or a binary's
// built-in one.
type helper struct {
	name    string
	join    func(tasks, argv []string) (string, []string)
	standby func(fd int, tasks, argv []string) (string, []string)
	// as and standbyAs are join and standby becoming a user.
	as        func(c *cgexec.Cred, tasks, argv []string) (string, []string)
	standbyAs func(c *cgexec.Cred, fd int, tasks, argv []string) (string, []string)
}

// helpers returns both implementations, each test running the same cases
// against both.
func helpers(t *testing.T) []helper {
	hs := []helper{{
		name: "shell",
		join: func(tasks, argv []string) (string, []string) { return cgexec.JoinCommand(false, "", nil, tasks, argv) },
		standby: func(fd int, tasks, argv []string) (string, []string) {
			return cgexec.StandbyCommand(false, "", nil, fd, tasks, argv)
		},
		as: func(c *cgexec.Cred, tasks, argv []string) (string, []string) {
			return cgexec.JoinCommand(false, "", c, tasks, argv)
		},
		standbyAs: func(c *cgexec.Cred, fd int, tasks, argv []string) (string, []string) {
			return cgexec.StandbyCommand(false, "", c, fd, tasks, argv)
		},
	}}
	if cgexec.Supported {
		bin := probe(t)
		hs = append(hs, helper{
			name: "builtin",
			join: func(tasks, argv []string) (string, []string) { return cgexec.JoinCommand(true, bin, nil, tasks, argv) },
			standby: func(fd int, tasks, argv []string) (string, []string) {
				return cgexec.StandbyCommand(true, bin, nil, fd, tasks, argv)
			},
			as: func(c *cgexec.Cred, tasks, argv []string) (string, []string) {
				return cgexec.JoinCommand(true, bin, c, tasks, argv)
			},
			standbyAs: func(c *cgexec.Cred, fd int, tasks, argv []string) (string, []string) {
				return cgexec.StandbyCommand(true, bin, c, fd, tasks, argv)
			},
		})
	} else {
		t.Log("no built-in helper on this platform: testing the shell only")
	}
	return hs
}

// command makes path/args a command bound by the test's context, with its
// output captured.
func command(t *testing.T, path string, args []string) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, path)
	cmd.Args = args
	cmd.WaitDelay = 5 * time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	return cmd, &out, &errOut
}

// fakeTasks makes n empty regular files standing in for tasks files: the
// helper writes "0" to each as it would to a cgroup's.
func fakeTasks(t *testing.T, n int) []string {
	t.Helper()
	dir := t.TempDir()
	var files []string
	for i := range n {
		f := filepath.Join(dir, "tasks"+strconv.Itoa(i))
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// The helper writes "0" to every tasks file, then execs the program in
// place (same pid) with exactly its arguments (empty ones, spaces, a second
// "--", glob characters) and the environment it was given.
func TestJoinWritesEveryFileThenExecsInPlace(t *testing.T) {
	for _, h := range helpers(t) {
		t.Run(h.name, func(t *testing.T) {
			tasks := fakeTasks(t, 4)
			script := `echo "$$"; for a; do printf '[%s]\n' "$a"; done; echo "env=$CGEXEC_TEST"`
			path, args := h.join(tasks, []string{"/bin/sh", "-c", script, "sh", "", "a b", "--", "*", "$HOME"})
			cmd, out, errOut := command(t, path, args)
			cmd.Env = append(os.Environ(), "CGEXEC_TEST=v 1")
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v: %s", err, errOut)
			}
			want := strconv.Itoa(cmd.Process.Pid) + "\n[]\n[a b]\n[--]\n[*]\n[$HOME]\nenv=v 1\n"
			if out.String() != want {
				t.Errorf("the program printed\n%s\nwant\n%s", out, want)
			}
			for _, f := range tasks {
				if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != "0" {
					t.Errorf("%s holds %q (%v), want 0", f, b, err)
				}
			}
		})
	}
}

// A file that cannot be written, a program that does not exist or cannot be
// exec'd, or no program at all: the helper exits 126 (127 for a missing
// program) with a line naming itself on stderr, and nothing runs.
func TestJoinFailures(t *testing.T) {
	for _, h := range helpers(t) {
		t.Run(h.name, func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(dir, "ran")
			prog := []string{"/bin/sh", "-c", `: > "$0"`, marker}
			notExec := filepath.Join(dir, "not-executable")
			if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			tasks := fakeTasks(t, 1)
			for _, tc := range []struct {
				name   string
				tasks  []string
				argv   []string
				code   int
				naming string // what the stderr line must name
			}{
				{"tasks file missing", append(tasks, filepath.Join(dir, "gone", "tasks")), prog, 126, filepath.Join(dir, "gone", "tasks")},
				{"tasks file a directory", []string{dir}, prog, 126, dir},
				{"program missing", tasks, []string{filepath.Join(dir, "nope")}, 127, filepath.Join(dir, "nope")},
				{"program not executable", tasks, []string{notExec}, 126, notExec},
				{"no program", tasks, nil, 126, ""},
			} {
				t.Run(tc.name, func(t *testing.T) {
					path, args := h.join(tc.tasks, tc.argv)
					cmd, _, errOut := command(t, path, args)
					err := cmd.Run()
					if got := exitCode(err); got != tc.code {
						t.Errorf("exit %d (%v), want %d; stderr %q", got, err, tc.code, errOut)
					}
					if !strings.HasPrefix(errOut.String(), cgexec.JoinName+":") || !strings.Contains(errOut.String(), tc.naming) {
						t.Errorf("stderr %q, want a line from %s naming %q", errOut, cgexec.JoinName, tc.naming)
					}
					if _, err := os.Stat(marker); err == nil {
						t.Errorf("the program ran")
					}
				})
			}
		})
	}
}

// The built-in helper's failure line carries an errno, which Explain turns
// into its text for the cell's exit reason.
func TestBuiltinFailureLineIsExplained(t *testing.T) {
	bin := probe(t)
	missing := filepath.Join(t.TempDir(), "gone", "tasks")
	path, args := cgexec.JoinCommand(true, bin, nil, []string{missing}, []string{"/bin/true"})
	cmd, _, errOut := command(t, path, args)
	if err := cmd.Run(); exitCode(err) != 126 {
		t.Fatalf("exit %v, want 126", err)
	}
	line := strings.TrimSpace(errOut.String())
	if want := cgexec.JoinName + ": cannot join " + missing + ": errno 2"; line != want {
		t.Errorf("stderr %q, want %q", line, want)
	}
	if got, want := cgexec.Explain(line), cgexec.JoinName+": cannot join "+missing+": no such file or directory"; got != want {
		t.Errorf("Explain: %q, want %q", got, want)
	}
}

func TestExplain(t *testing.T) {
	for in, want := range map[string]string{
		"cellvisor-cgexec: cannot exec /x: errno 13":               "cellvisor-cgexec: cannot exec /x: permission denied",
		"cellvisor-cgexec: cannot join /a: errno 2: errno 28":      "cellvisor-cgexec: cannot join /a: errno 2: no space left on device",
		"cellvisor-cgexec: bad arguments":                          "cellvisor-cgexec: bad arguments",
		"cellvisor-cgexec: 1: cannot create /x: Permission denied": "cellvisor-cgexec: 1: cannot create /x: Permission denied",
		"cellvisor-cgexec: cannot join /a: errno 0":                "cellvisor-cgexec: cannot join /a: errno 0",
		"cellvisor-cgexec: cannot join /a: errno 99999999":         "cellvisor-cgexec: cannot join /a: errno 99999999",
		"nginx: cannot join /a: errno 2":                           "nginx: cannot join /a: errno 2",
	} {
		if got := cgexec.Explain(in); got != want {
			t.Errorf("Explain(%q) = %q, want %q", in, got, want)
		}
	}
}

// A standby joins at once, then execs its program only on the line "exec",
// with the pipe closed; end of file or any other line makes it exit 0 with
// nothing run. A join failure ends it before it waits.
func TestStandby(t *testing.T) {
	for _, h := range helpers(t) {
		t.Run(h.name, func(t *testing.T) {
			for _, tc := range []struct {
				name string
				send string // "" closes the pipe unwritten
				ran  bool
				fail bool // a tasks file is missing
				code int
			}{
				{name: "released", send: "exec\n", ran: true},
				{name: "closed", send: ""},
				{name: "another line", send: "nope\n"},
				{name: "exec without its newline", send: "exec"},
				{name: "join fails", fail: true, code: 126},
			} {
				t.Run(tc.name, func(t *testing.T) {
					tasks := fakeTasks(t, 2)
					if tc.fail {
						tasks = append(tasks, filepath.Join(t.TempDir(), "gone", "tasks"))
					}
					r, w, err := os.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					defer w.Close()
					// The program prints whether it got fd 3 (the pipe's
					// number in the standby): it must not.
					prog := []string{"/bin/sh", "-c", `echo ran; readlink /proc/$$/fd/3 || echo no-fd-3`}
					path, args := h.standby(3, tasks, prog)
					cmd, out, errOut := command(t, path, args)
					cmd.ExtraFiles = []*os.File{r}
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					r.Close()
					if !tc.fail {
						// Joined before anything is sent.
						testutil.Eventually(t, 10*time.Second, func() error {
							for _, f := range tasks {
								if b, _ := os.ReadFile(f); strings.TrimSpace(string(b)) != "0" {
									return fmt.Errorf("%s not yet joined", f)
								}
							}
							return nil
						})
						if tc.send != "" {
							if _, err := w.WriteString(tc.send); err != nil {
								t.Fatal(err)
							}
						}
					}
					w.Close()
					err = cmd.Wait()
					if got := exitCode(err); got != tc.code {
						t.Fatalf("exit %d (%v), want %d; stderr %q", got, err, tc.code, errOut)
					}
					if got := out.String(); tc.ran != strings.HasPrefix(got, "ran\n") {
						t.Errorf("program output %q, want it run: %v", got, tc.ran)
					} else if tc.ran && !strings.HasSuffix(got, "no-fd-3\n") {
						t.Errorf("the released program has the standby's pipe as fd 3: %q", got)
					}
				})
			}
		})
	}
}

// Under any other argv[0] a binary carrying the helper is itself; a binary
// without it (this test) says so.
func TestBuiltinOnlyUnderItsNames(t *testing.T) {
	if cgexec.Builtin() {
		t.Errorf("the test binary, not linked with LDFlags, says it carries the helper")
	}
	bin := probe(t)
	for _, arg0 := range []string{bin, "probe", cgexec.JoinName + "x", cgexec.JoinName[:len(cgexec.JoinName)-1], cgexec.StandbyName + "-", "", "c"} {
		cmd, out, errOut := command(t, bin, []string{arg0, "--", "/bin/false"})
		if err := cmd.Run(); err != nil {
			t.Fatalf("argv[0] %q: %v: %s", arg0, err, errOut)
		}
		var got struct {
			Builtin bool
			Args    []string
		}
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("argv[0] %q: %v: %q", arg0, err, out)
		}
		if !got.Builtin || !slices.Equal(got.Args, []string{arg0, "--", "/bin/false"}) {
			t.Errorf("argv[0] %q: the program said %+v, want builtin and its own arguments", arg0, got)
		}
	}
}

// A standby's pipe must be a number: anything else is refused before a
// group is joined.
func TestBuiltinStandbyRefusesABadFD(t *testing.T) {
	bin := probe(t)
	for _, fd := range []string{"", "x", "3x", "-1", "123456"} {
		tasks := fakeTasks(t, 1)
		cmd, _, errOut := command(t, bin, []string{cgexec.StandbyName, fd, tasks[0], "--", "/bin/true"})
		if err := cmd.Run(); exitCode(err) != 126 || !strings.Contains(errOut.String(), "bad arguments") {
			t.Errorf("fd %q: exit %v, stderr %q; want 126, bad arguments", fd, err, errOut)
		}
		if b, _ := os.ReadFile(tasks[0]); len(b) != 0 {
			t.Errorf("fd %q: joined %q before refusing", fd, b)
		}
	}
}

// In real v1 groups, the built-in helper's program runs in every hierarchy
// of its group.
func TestBuiltinJoinsRealGroups(t *testing.T) {
	bin := probe(t)
	m := testutil.RequireCgroups(t)
	if m.Mode() != cgroup.ModeV1Hybrid {
		t.Skipf("cgroup mode %s: only v1 joins through the helper", m.Mode())
	}
	g, err := m.Ensure("cell-01", cgroup.Limits{MemoryBytes: 64 << 20, CPUQuotaUS: 50000, CPUPeriodUS: 100000, PIDs: 16})
	if err != nil {
		t.Fatal(err)
	}
	var tasks []string
	for c, p := range g.Paths() {
		tasks = append(tasks, filepath.Join("/sys/fs/cgroup", c, p, "tasks"))
	}
	path, args := cgexec.JoinCommand(true, bin, nil, tasks, []string{"/bin/cat", "/proc/self/cgroup"})
	cmd, out, errOut := command(t, path, args)
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	for c, p := range g.Paths() {
		if !slices.ContainsFunc(strings.Split(out.String(), "\n"), func(l string) bool {
			_, rest, _ := strings.Cut(l, ":")
			ctrls, at, _ := strings.Cut(rest, ":")
			return slices.Contains(strings.Split(ctrls, ","), c) && at == p
		}) {
			t.Errorf("the program is not in %s:%s:\n%s", c, p, out)
		}
	}
}

// make build links the agent with the helper's entry point, where LDFlags
// has one.
func TestMakefileLinksTheAgentWithTheHelper(t *testing.T) {
	data, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var def, build bool
	for _, l := range strings.Split(string(data), "\n") {
		def = def || strings.HasPrefix(l, "CGEXEC_LDFLAGS :=") && strings.Contains(l, "linux/amd64") && strings.Contains(l, "-E "+cgexec.EntrySymbol+")")
		build = build || strings.Contains(l, "$(CGEXEC_LDFLAGS)") && strings.HasSuffix(l, "-o bin/cellvisor ./cmd/cellvisor")
	}
	if !def || !build {
		t.Errorf("the Makefile defines CGEXEC_LDFLAGS as -E %s on linux/amd64: %v; builds bin/cellvisor with it: %v", cgexec.EntrySymbol, def, build)
	}
	if cgexec.Supported != (cgexec.LDFlags() != "") {
		t.Errorf("LDFlags %q on a platform with the helper: %v", cgexec.LDFlags(), cgexec.Supported)
	}
}

// With a user to become, both helpers join first (as the caller, who owns
// the groups' files), then run the program as that user and group with no
// supplementary groups, a umask of 007 and without CAP_SETUID or
// CAP_SETGID, as a join and as a released standby.
func TestBecomesTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root (or CAP_SETUID and CAP_SETGID)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("the shell helper needs setpriv (util-linux)")
	}
	const uid, gid = 64123, 64124 // need not exist in /etc/passwd
	// The tasks files are root's: only a helper that joins before it
	// switches can write them.
	script := `echo "$(id -u) $(id -g) $(id -G) $(umask)"; grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status`
	want := fmt.Sprintf("%d %d %d 0007", uid, gid, gid)
	for _, h := range helpers(t) {
		t.Run(h.name, func(t *testing.T) {
			check := func(t *testing.T, out string) {
				t.Helper()
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if len(lines) == 0 || lines[0] != want {
					t.Fatalf("the program says %q, want %q", out, want)
				}
				for _, l := range lines[1:] {
					if f := strings.Fields(l); len(f) != 2 || strings.Trim(f[1], "0") != "" {
						t.Errorf("capabilities %q, want none", l)
					}
				}
			}
			t.Run("join", func(t *testing.T) {
				tasks := fakeTasks(t, 2)
				path, args := h.as(&cgexec.Cred{UID: uid, GID: gid}, tasks, []string{"/bin/sh", "-c", script})
				cmd, out, errOut := command(t, path, args)
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v: %s", err, errOut)
				}
				check(t, out.String())
				for _, f := range tasks {
					if b, _ := os.ReadFile(f); strings.TrimSpace(string(b)) != "0" {
						t.Errorf("%s holds %q, want the join's 0", f, b)
					}
				}
			})
			// As a non-root agent does: CAP_SETUID, CAP_SETGID and
			// CAP_NET_BIND_SERVICE ambient; the program keeps only the last.
			t.Run("non-root agent", func(t *testing.T) {
				tasks := fakeTasks(t, 1)
				if err := os.Chown(tasks[0], 64100, 64100); err != nil {
					t.Fatal(err)
				}
				path, args := h.as(&cgexec.Cred{UID: uid, GID: gid}, tasks, []string{"/bin/sh", "-c", "grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status"})
				dirs := []string{filepath.Dir(tasks[0]), filepath.Dir(filepath.Dir(tasks[0]))}
				if path != "/bin/sh" {
					dirs = append(dirs, filepath.Dir(path)) // the probe's
				}
				for _, d := range dirs {
					if err := os.Chmod(d, 0o755); err != nil { // t.TempDir's and the probe's are 0700
						t.Fatal(err)
					}
				}
				caps := "+setuid,+setgid,+net_bind_service"
				cmd, out, errOut := command(t, "/usr/bin/setpriv", append([]string{"setpriv", "--securebits=+no_setuid_fixup",
					"--reuid=64100", "--regid=64100", "--clear-groups", "--inh-caps=" + caps, "--ambient-caps=" + caps,
					"--bounding-set=-all," + caps, "/bin/bash", "-c", `exec -a "$0" "$@"`, args[0], path}, args[1:]...))
				if err := cmd.Run(); err != nil {
					t.Fatalf("%v: %s", err, errOut)
				}
				for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
					if f := strings.Fields(l); len(f) != 2 || strings.TrimLeft(f[1], "0") != "400" {
						t.Errorf("capabilities %q, want CAP_NET_BIND_SERVICE (400) alone", l)
					}
				}
			})
			t.Run("standby", func(t *testing.T) {
				tasks := fakeTasks(t, 1)
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				path, args := h.standbyAs(&cgexec.Cred{UID: uid, GID: gid}, 3, tasks, []string{"/bin/sh", "-c", script})
				cmd, out, errOut := command(t, path, args)
				cmd.ExtraFiles = []*os.File{r}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				r.Close()
				if _, err := w.WriteString(cgexec.ReleaseLine); err != nil {
					t.Fatal(err)
				}
				if err := cmd.Wait(); err != nil {
					t.Fatalf("%v: %s", err, errOut)
				}
				check(t, out.String())
			})
		})
	}
}

// A malformed user is refused with exit 126; a user the helper cannot
// become (not root: setgroups fails) is named in the failure.
func TestBuiltinRefusesABadUser(t *testing.T) {
	bin := probe(t)
	for _, arg := range []string{"+", "+1", "+1:", "+:1", "+a:1", "+1:b", "+12345678901:1", "+4294967295:1", "+1:4294967295"} {
		tasks := fakeTasks(t, 1)
		cmd, _, errOut := command(t, bin, []string{cgexec.JoinName, arg, tasks[0], "--", "/bin/true"})
		if err := cmd.Run(); exitCode(err) != 126 || !strings.Contains(errOut.String(), "bad arguments") {
			t.Errorf("user %q: exit %v, stderr %q; want 126, bad arguments", arg, err, errOut)
		}
	}
	if os.Geteuid() == 0 {
		return
	}
	tasks := fakeTasks(t, 1)
	cmd, _, errOut := command(t, bin, []string{cgexec.JoinName, "+64123:64124", tasks[0], "--", "/bin/true"})
	if err := cmd.Run(); exitCode(err) != 126 || !strings.HasPrefix(errOut.String(), cgexec.JoinName+": cannot become +64123:64124: errno 1") {
		t.Errorf("exit %v, stderr %q; want 126, cannot become, EPERM", err, errOut)
	}
}
