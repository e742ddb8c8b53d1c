package supervisor

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"cellvisor/cgexec"
)

// logMark is where a cell's logs ended when its master was started: what
// comes after was written during that master's lifetime.
type logMark struct {
	errorLog, stderr int64
	// at is the wall-clock time of the mark: nginx dates its lines by the
	// wall clock, whatever clock the supervisor runs on.
	at time.Time
}

// markLogs records the current sizes of a cell's error.log and stderr.log.
func markLogs(dir string) logMark {
	size := func(name string) int64 {
		if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return fi.Size()
		}
		return 0
	}
	return logMark{errorLog: size("error.log"), stderr: size("stderr.log"), at: time.Now()}
}

// maxDetail bounds how much of a log the exit reason reads and quotes.
const (
	maxDetailRead = 4096
	maxDetailLine = 512
)

// exitDetail is the last emerg, alert or crit line that the master pid
// started at the mark wrote to the cell's logs, else its last error line
// (an init_by_lua error is one: the master exits with status 1 after it),
// or "": from error.log only lines past the mark dated from its start and
// written by that pid (never a worker's error about one request); from
// stderr.log only what was appended past the mark (nginx's stderr lines
// carry neither). A line of an earlier master is never quoted as this
// exit's reason, even after the logs were rotated.
func exitDetail(dir string, m logMark, pid int) string {
	errorLog, errErr := readSince(filepath.Join(dir, "error.log"), m.errorLog)
	stderr, stderrErr := readSince(filepath.Join(dir, "stderr.log"), m.stderr)
	mine := func(l string) bool { return ownLine(l, pid, m.at) }
	any := func(string) bool { return true }
	for _, levels := range [][]string{{"[emerg]", "[alert]", "[crit]"}, {"[error]"}} {
		if errErr == nil {
			if l := lastAlert(errorLog, levels, mine); l != "" {
				return l
			}
		}
		if stderrErr == nil {
			if l := lastAlert(stderr, levels, any); l != "" {
				return l
			}
		}
	}
	return ""
}

// lastAlert returns the last line of data that reports a condition of one
// of levels (or the cgroup join helper's failure, its errno as text) and
// that own accepts, cut to maxDetailLine bytes.
func lastAlert(data []byte, levels []string, own func(string) bool) string {
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if !slices.ContainsFunc(levels, func(lv string) bool { return strings.Contains(l, lv) }) &&
			!strings.HasPrefix(l, "cellvisor-cgexec") {
			continue
		}
		if own(l) {
			l = cgexec.Explain(l)
			if len(l) > maxDetailLine {
				l = l[:maxDetailLine] + "…"
			}
			return l
		}
	}
	return ""
}

// ownLine tells whether an nginx error log line ("2026/12/01 14:23:00
// [emerg] 4242#4242: ...", local time) was written by pid at or after
// started (to the second: the log has no finer time).
func ownLine(l string, pid int, started time.Time) bool {
	const layout = "2006/01/02 15:04:05"
	if len(l) < len(layout) {
		return false
	}
	at, err := time.ParseInLocation(layout, l[:len(layout)], time.Local)
	if err != nil || at.Before(started.Truncate(time.Second)) {
		return false
	}
	_, rest, ok := strings.Cut(l[len(layout):], "] ")
	if !ok {
		return false
	}
	n, _, ok := strings.Cut(rest, "#")
	return ok && n == strconv.Itoa(pid)
}

// readSince reads what path holds past offset, at most the last
// maxDetailRead bytes of it; all of it (within the bound) when the file is
// now shorter than offset (rotated).
func readSince(path string, offset int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < offset {
		offset = 0
	}
	offset = max(offset, st.Size()-maxDetailRead)
	buf := make([]byte, st.Size()-offset)
	n, err := f.ReadAt(buf, offset)
	if n > 0 {
		err = nil
	}
	return bytes.TrimRight(buf[:n], "\x00"), err
}
