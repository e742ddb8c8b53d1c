package procstat

import (
	"os"
	"os/exec"
	"strconv"
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
