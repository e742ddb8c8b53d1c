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
		{"over the bound", strings.Repeat("a", MaxReasonBytes+1), strings.Repeat("a", MaxReasonBytes-len("…")) + "…"},
		{"escapes over the bound", strings.Repeat("\x00", MaxReasonBytes), strings.Repeat(`\x00`, (MaxReasonBytes-len("…"))/4) + "…"},
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
	if Reason(nil) != "" {
		t.Error("nil error has a reason")
	}
}
