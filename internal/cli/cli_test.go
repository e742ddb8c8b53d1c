package cli

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Colour goes only to a terminal: a pipe (journald, a CI log) is not one,
// a pseudo-terminal is.
func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(w) {
		t.Error("a pipe is taken for a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if IsTerminal(f) {
		t.Error("a file is taken for a terminal")
	}
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	defer ptmx.Close()
	if !IsTerminal(ptmx) {
		t.Error("a pseudo-terminal is not taken for a terminal")
	}
}

func TestNewLoggerRefusals(t *testing.T) {
	if _, err := NewLogger("xml", "info"); err == nil {
		t.Error(`log format "xml" accepted`)
	}
	if _, err := NewLogger("json", "loud"); err == nil {
		t.Error(`log level "loud" accepted`)
	}
	for _, f := range []string{"json", "console"} {
		if _, err := NewLogger(f, "debug"); err != nil {
			t.Errorf("log format %s: %v", f, err)
		}
	}
}

// Values echoed from input reach a terminal or a log line with their
// control characters escaped: no line of their own, no overwrite.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain https://x.example/a b\tc":       "plain https://x.example/a b\tc",
		"https://a.example\r\nrefused (x): ok": `https://a.example\r\nrefused (x): ok`,
		"\x1b[2Kfake":                          `\x1b[2Kfake`,
		"bidi \u202eevil":                      `bidi \u202eevil`,
		"bad \xff utf8 é":                      `bad \xff utf8 é`,
	} {
		if got := Printable(in); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}
