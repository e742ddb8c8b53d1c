package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExitDetailQuotesOnlyThisMaster(t *testing.T) {
	started := time.Date(2026, 12, 1, 14, 23, 5, 400e6, time.Local)
	line := func(at time.Time, pid, level, msg string) string {
		return at.Format("2006/01/02 15:04:05") + " [" + level + "] " + pid + "#" + pid + ": " + msg
	}
	before := started.Add(-30 * time.Minute)
	for _, tc := range []struct {
		name     string
		errorLog string
		stderr   string
		rotated  bool // the mark is past the file's end
		want     string
	}{
		{"own alert after start", line(started, "4242", "alert", "mine"), "", false, "mine"},
		{"own emerg in the start's second", line(started.Truncate(time.Second), "4242", "emerg", "bind failed"), "", false, "bind failed"},
		{"old alert of another master", line(before, "999", "alert", "old"), "", false, ""},
		{"old alert of another master, logs rotated", line(before, "999", "alert", "old"), "", true, ""},
		{"another pid after start", line(started, "999", "alert", "not mine"), "", false, ""},
		{"own pid, before its start (a recycled pid)", line(before, "4242", "crit", "recycled"), "", true, ""},
		{"not an alert", line(started, "4242", "warn", "just a warning"), "", false, ""},
		{"the last own one wins", line(started, "4242", "alert", "first") + "\n" + line(started, "4242", "crit", "second") + "\n" + line(started, "4243", "alert", "worker"), "", false, "second"},
		{"stderr past the mark", "", "nginx: [emerg] unknown directive \"x\"", false, "unknown directive"},
		{"cgroup join failure", "", "cellvisor-cgexec: 1: cannot create /sys/fs/cgroup/x: Permission denied", false, "cannot create"},
		{"built-in join helper's failure", "", "cellvisor-cgexec: cannot join /sys/fs/cgroup/x/tasks: errno 13", false, "cannot join /sys/fs/cgroup/x/tasks: permission denied"},
		{"garbage", "\x00\x00 [alert]\n[alert] 4242#", "", false, ""},
		{"own error line, no alert", line(started, "4242", "error", "init_by_lua error: too short"), "", false, "init_by_lua error: too short"},
		{"a worker's error is not the master's", line(started, "4243", "error", "upstream timed out"), "", false, ""},
		{"an alert wins over a later error", line(started, "4242", "alert", "the alert") + "\n" + line(started, "4242", "error", "an error"), "", false, "the alert"},
		{"stderr error line", "", "nginx: [error] init_by_lua error: boom", false, "init_by_lua error: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			// What was there before the master started: an old alert, past
			// the mark unless the logs were rotated.
			old := line(before, "999", "alert", "old") + "\nnginx: [emerg] old stderr\n"
			var m logMark
			if !tc.rotated {
				os.WriteFile(filepath.Join(dir, "error.log"), []byte(old), 0o644)
				os.WriteFile(filepath.Join(dir, "stderr.log"), []byte(old), 0o644)
				m = markLogs(dir)
			} else {
				m = logMark{errorLog: 1 << 20, stderr: 1 << 20}
			}
			m.at = started
			appendTo := func(name, s string) {
				f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteString(s + "\n")
				f.Close()
			}
			appendTo("error.log", tc.errorLog)
			appendTo("stderr.log", tc.stderr)
			got := exitDetail(dir, m, 4242)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("detail %q, want one with %q", got, tc.want)
			}
		})
	}
}

func TestExitDetailIsBounded(t *testing.T) {
	dir := t.TempDir()
	long := time.Now().Format("2006/01/02 15:04:05") + " [alert] 7#7: " + strings.Repeat("x", 3000)
	os.WriteFile(filepath.Join(dir, "error.log"), []byte(long+"\n"), 0o644)
	got := exitDetail(dir, logMark{at: time.Now().Add(-time.Second)}, 7)
	if got == "" || len(got) > maxDetailLine+len("…") {
		t.Errorf("detail of %d bytes, want 1–%d", len(got), maxDetailLine+len("…"))
	}
}
