package manifest

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxReasonBytes bounds a refusal reason carried in an ack or a log line.
const MaxReasonBytes = 256

// Reason renders a refusal for an ack, a log line or status: at most
// MaxReasonBytes bytes of valid UTF-8, with control and other
// non-printing characters (newlines, escape sequences, bidirectional
// overrides, invalid bytes) escaped as \xNN or \uNNNN, cut with "…" when
// longer. Much of a refusal's text comes from its input (domain and pool
// names, artifact content), which an attacker may have chosen.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	return CutReason(err.Error())
}

// CutReason is Reason for a string.
func CutReason(s string) string {
	const ellipsis = "…"
	var b strings.Builder
	cut := 0 // the longest prefix of whole pieces that leaves room for "…"
	for i := 0; i < len(s) && b.Len() <= MaxReasonBytes; {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == ' ' || unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
		if b.Len() <= MaxReasonBytes-len(ellipsis) {
			cut = b.Len()
		}
	}
	if b.Len() <= MaxReasonBytes {
		return b.String()
	}
	return b.String()[:cut] + ellipsis
}
