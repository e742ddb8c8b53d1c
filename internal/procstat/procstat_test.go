package procstat

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A command name with spaces and parentheses does not shift the fields.
func TestParseAfterTheCommandName(t *testing.T) {
	line := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 12345 1024 56 18446744073709551615\n"
	f, err := Parse([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != "S" || f[2] != "4242" || f[11] != "7" || f[12] != "3" || f[19] != "12345" || f[20] != "1024" || f[21] != "56" {
		t.Errorf("fields %q", f)
	}
}

// A line cut short, or without a command name, is refused.
func TestParseRefusesMalformed(t *testing.T) {
	for _, line := range []string{"4242 (nginx) S 1 2 3", "4242 nginx S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22"} {
		if f, err := Parse([]byte(line)); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", line, f)
		}
	}
}

// This process's own fields: running, its own process group's member, and
// an error for a pid that does not exist.
func TestFieldsOfThisProcess(t *testing.T) {
	f, err := Fields(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != "R" && f[0] != "S" {
		t.Errorf("state %q", f[0])
	}
	if pgid, _ := strconv.Atoi(f[2]); pgid <= 0 {
		t.Errorf("process group %q", f[2])
	}
	if _, err := Fields(1 << 30); err == nil {
		t.Error("no error for a pid that does not exist")
	}
}

// A live process is neither exiting nor about to: no PF_EXITING, no
// SIGKILL pending. A status with SIGKILL pending for the thread or its
// group reads as about to exit.
func TestKillPendingAndExiting(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep to run:", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	f, err := Fields(pid)
	if err != nil {
		t.Fatal(err)
	}
	if Exiting(f) {
		t.Fatalf("a sleeping process reads as exiting (flags %s)", f[6])
	}
	if dying, err := KillPending(pid); err != nil || dying {
		t.Fatalf("a live process: kill pending %v, %v", dying, err)
	}
	if !Exiting([]string{"R", "1", "1", "1", "0", "-1", "4194308"}) {
		t.Error("flags with PF_EXITING not read as exiting")
	}
	if Exiting([]string{"R", "1", "1", "1", "0", "-1", "4194304"}) {
		t.Error("flags without PF_EXITING read as exiting")
	}
	for status, want := range map[string]bool{
		"Name:\tnginx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n": true,
		"SigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n":               true,
		"SigPnd:\t0000000000004000\nShdPnd:\t0000000000000001\n":               false, // SIGTERM, SIGHUP
	} {
		if got, err := killPendingIn([]byte(status)); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", status, got, err, want)
		}
	}
	if _, err := killPendingIn([]byte("ShdPnd:\tnot hex\n")); err == nil {
		t.Error("a malformed mask was read")
	}
}

// fixture is a /proc tree under testdata: 4242 sleeps, its title holding
// spaces and parentheses and ") S 1 (" besides; 4243 is a zombie; 4244 is
// exiting with a SIGKILL pending; 4245 does not exist; 4246's stat is cut
// short and its status malformed.
var fixture = Reader{Root: "testdata/proc"}

// A Reader reads its Root's tree: the fields after a title with spaces
// and parentheses, a zombie's state, an exiting process's flags and
// pending SIGKILL, a uid; and errors naming the fixture's file for a pid
// that is missing or malformed.
func TestReaderFixture(t *testing.T) {
	f, err := fixture.Fields(4242)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: "S", 1: "1", 2: "4242", 6: "4194560", 11: "7", 12: "3", 19: "12345", 20: "1024", 21: "56"} {
		if f[i] != want {
			t.Errorf("4242: f[%d] = %q, want %q (fields %q)", i, f[i], want, f)
		}
	}
	if Dead(f[0]) || Exiting(f) {
		t.Errorf("4242 reads as dead (%v) or exiting (%v)", Dead(f[0]), Exiting(f))
	}
	if uid, err := fixture.UID(4242); err != nil || uid != 101 {
		t.Errorf("4242: uid %d, %v, want the real uid 101", uid, err)
	}
	if dying, err := fixture.KillPending(4242); err != nil || dying {
		t.Errorf("4242: kill pending %v, %v", dying, err)
	}

	if f, err := fixture.Fields(4243); err != nil || !Dead(f[0]) || f[19] != "12400" {
		t.Errorf("4243: %q, %v, want a zombie started at 12400", f, err)
	}

	f, err = fixture.Fields(4244)
	if err != nil || f[0] != "R" || !Exiting(f) || f[28] != "256" {
		t.Errorf("4244: %q, %v, want running, exiting, SIGKILL in its signal field", f, err)
	}
	if dying, err := fixture.KillPending(4244); err != nil || !dying {
		t.Errorf("4244: kill pending %v, %v, want true", dying, err)
	}
	if uid, err := fixture.UID(4244); err != nil || uid != 0 {
		t.Errorf("4244: uid %d, %v, want 0", uid, err)
	}

	for name, read := range map[string]func(int) error{
		"stat":   func(pid int) error { _, err := fixture.Fields(pid); return err },
		"status": func(pid int) error { _, err := fixture.UID(pid); return err },
	} {
		err := read(4245)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "testdata/proc/4245/"+name) {
			t.Errorf("missing pid, %s: %v, want not-exist naming testdata/proc/4245/%s", name, err, name)
		}
	}
	if _, err := fixture.KillPending(4245); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing pid, kill pending: %v, want not-exist", err)
	}

	if f, err := fixture.Fields(4246); err == nil || !strings.Contains(err.Error(), "testdata/proc/4246/stat: malformed") {
		t.Errorf("a stat cut short: %q, %v", f, err)
	}
	if _, err := fixture.UID(4246); err == nil || !strings.Contains(err.Error(), "testdata/proc/4246/status: no Uid line") {
		t.Errorf("a status without Uid: %v", err)
	}
	if _, err := fixture.KillPending(4246); err == nil || !strings.Contains(err.Error(), "testdata/proc/4246/status: SigPnd") {
		t.Errorf("a status with a malformed SigPnd: %v", err)
	}
}

// The zero Reader reads /proc, as the package's functions do.
func TestReaderPaths(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Reader{}.PIDPath(42, "stat"), "/proc/42/stat"},
		{Reader{}.PIDPath(42, ""), "/proc/42"},
		{Reader{}.Path("net/tcp"), "/proc/net/tcp"},
		{Reader{Root: DefaultRoot}.PIDPath(7, "status"), "/proc/7/status"},
		{fixture.PIDPath(42, "task/42/children"), "testdata/proc/42/task/42/children"},
	} {
		if tc.got != tc.want {
			t.Errorf("path %q, want %q", tc.got, tc.want)
		}
	}
	mine, err := Fields(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	zero, err := Reader{}.Fields(os.Getpid())
	if err != nil || zero[19] != mine[19] {
		t.Errorf("the zero Reader: start time %v, %v; Fields: %v", zero, err, mine[19])
	}
}
