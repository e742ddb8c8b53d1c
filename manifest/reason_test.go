package manifest

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestReasonIsBoundedAndEscaped(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", "artifact SHA-256 mismatch: a.example.com revision 2", "artifact SHA-256 mismatch: a.example.com revision 2"},
		{"newline and escape", "bad\n\x1b[31mred", `bad\x0a\x1b[31mred`},
		{"bidi override", "a\u202eb", `a\u202eb`},
		{"invalid utf-8", "a\xffb", `a\xffb`},
		{"exactly the bound", strings.Repeat("a", MaxReasonBytes), strings.Repeat("a", MaxReasonBytes)},
		{"over the bound keeps its start and its end", "entry " + strings.Repeat("a", 1<<20) + ": not a valid hostname",
			"entry " + strings.Repeat("a", MaxReasonBytes-len("entry ")-len("…")-96) + "…" + strings.Repeat("a", 96-len(": not a valid hostname")) + ": not a valid hostname"},
		{"escapes over the bound", strings.Repeat("\x00", MaxReasonBytes), strings.Repeat(`\x00`, (MaxReasonBytes-len("…")-96)/4) + "…" + strings.Repeat(`\x00`, 96/4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Reason(errors.New(tc.in))
			if got != tc.want {
				t.Errorf("Reason(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if len(got) > MaxReasonBytes || !utf8.ValidString(got) {
				t.Errorf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
	// Whatever it is given, the result is bounded, valid and printable.
	for _, s := range []string{strings.Repeat("é", 300), strings.Repeat("\xff\u202e", 100), strings.Repeat("ab\n", 1000)} {
		got := CutReason(s)
		if len(got) > MaxReasonBytes || !utf8.ValidString(got) || strings.ContainsAny(got, "\n\u202e") {
			t.Errorf("CutReason(%q…) = %q", s[:9], got)
		}
	}
	if Reason(nil) != "" {
		t.Error("nil error has a reason")
	}
}
