package manifest

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxReasonBytes bounds a refusal reason carried in an ack or a log line.
const MaxReasonBytes = 256

// Reason renders a refusal for an ack, a log line or status: at most
// MaxReasonBytes bytes of valid UTF-8, with control and other
// non-printing characters (newlines, escape sequences, bidirectional
// overrides, invalid bytes) escaped as \xNN or \uNNNN. A longer one keeps
// its start and its end, which says why, around "…". Much of a refusal's
// text comes from its input (domain and pool names, artifact content),
// which an attacker may have chosen.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	return CutReason(err.Error())
}

const (
	ellipsis  = "…"
	tailBytes = 96 // of a cut reason, its end
)

// CutReason is Reason for a string.
func CutReason(s string) string {
	head := make([]byte, 0, MaxReasonBytes+8)
	i := 0
	for i < len(s) && len(head) <= MaxReasonBytes {
		piece, size := escapeFirst(s[i:])
		head = append(head, piece...)
		i += size
	}
	if i == len(s) && len(head) <= MaxReasonBytes {
		return string(head)
	}
	// The end, escaped from the last rune back, within tailBytes.
	var tail []byte
	for j := len(s); j > i; {
		piece, size := escapeLast(s[:j])
		if len(tail)+len(piece) > tailBytes {
			break
		}
		tail = append([]byte(piece), tail...)
		j -= size
	}
	// The start, cut at a piece boundary to fit what is left.
	room := MaxReasonBytes - len(ellipsis) - len(tail)
	n := 0
	for k := 0; k < len(s) && n < room; {
		piece, size := escapeFirst(s[k:])
		if n+len(piece) > room {
			break
		}
		n += len(piece)
		k += size
	}
	return string(head[:n]) + ellipsis + string(tail)
}

// escapeFirst escapes the first rune of s and returns it with the number
// of bytes of s it stands for; escapeLast does the same for the last.
func escapeFirst(s string) (string, int) {
	r, size := utf8.DecodeRuneInString(s)
	return escape(r, s[:size]), size
}

func escapeLast(s string) (string, int) {
	r, size := utf8.DecodeLastRuneInString(s)
	return escape(r, s[len(s)-size:]), size
}

// escape is raw, the bytes of r, or its escape.
func escape(r rune, raw string) string {
	switch {
	case r == utf8.RuneError && len(raw) == 1:
		return fmt.Sprintf(`\x%02x`, raw[0])
	case r == ' ' || unicode.IsPrint(r):
		return raw
	case r < 0x80:
		return fmt.Sprintf(`\x%02x`, r)
	}
	return fmt.Sprintf(`\u%04x`, r)
}
