// Package frontdoor owns the deny-closed front-door resolver: it normalizes
// a URL to its origin (scheme, A-label host, explicit port), matches it
// exactly against an org's front-door rows and answers one edge or a typed
// refusal (unmapped, ambiguous, corrupt row, malformed input). It never
// guesses and never falls back. It is pure: no store, no HTTP. The
// control API (controlapi) and the agent (agent) import it; the cells run
// its Lua twin (runtime/lua/frontdoor.lua), pinned to it by
// testdata/cases.json.
package frontdoor

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

// Limits on input. A URL longer than MaxURLLen is refused before it is
// parsed; a host is at most 253 octets in A-label form, a label 63.
const (
	MaxURLLen   = 2048
	maxHostLen  = 253
	maxLabelLen = 63
	maxEdgeLen  = 64
)

// strict converts U-labels to A-labels and validates A-labels as IDNA2008
// registration does: no mapping (a Unicode upper-case letter is refused, not
// folded), STD3 characters, hyphen, joiner and bidi rules, DNS lengths.
var strict = idna.Registration

// Normalize returns the canonical origin of raw, "scheme://host:port", or a
// *Refusal with reason Malformed. Rules (the Lua twin follows them step by
// step; docs/frontdoors.md explains why):
//   - at most MaxURLLen bytes, valid UTF-8, no ASCII control or space
//     character, no backslash;
//   - the scheme is http or https, in any case, followed by "://";
//   - userinfo ("user@") is refused: a front door never carries credentials,
//     and "https://shop.example@evil.example" must not read as shop;
//   - the path, query and fragment are dropped: a front door is an origin;
//   - the port, when given, is 1-65535 in decimal digits without a sign; the
//     scheme's default (80, 443) is written explicitly in the result;
//   - the host is lower-cased (ASCII), one trailing dot is removed, its
//     labels are converted to A-labels by IDNA2008 registration rules; an IP
//     literal (brackets, or a last label of digits only) is refused: a front
//     door is a name, and "0x7f.1" or "2130706433" would be guesses.
func Normalize(raw string) (string, error) {
	if len(raw) > MaxURLLen {
		return "", malformed("url is %d bytes, more than %d", len(raw), MaxURLLen)
	}
	if !utf8.ValidString(raw) {
		return "", malformed("url is not valid UTF-8")
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= 0x20 || c == 0x7f || c == '\\' {
			return "", malformed("url has a control, space or backslash character at byte %d", i)
		}
	}
	sep := strings.Index(raw, "://")
	if sep < 0 {
		return "", malformed("url has no scheme://")
	}
	scheme := strings.ToLower(raw[:sep])
	var defPort int
	switch scheme {
	case "http":
		defPort = 80
	case "https":
		defPort = 443
	default:
		return "", malformed("scheme %q is not http or https", raw[:sep])
	}
	rest := raw[sep+3:]
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	if strings.Contains(rest, "@") {
		return "", malformed("url carries userinfo")
	}
	hostport := rest
	port := defPort
	if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		p, err := parsePort(hostport[i+1:])
		if err != nil {
			return "", err
		}
		port = p
		hostport = hostport[:i]
	}
	host, err := normalizeHost(hostport)
	if err != nil {
		return "", err
	}
	return scheme + "://" + host + ":" + strconv.Itoa(port), nil
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, malformed("port %q is not 1-65535", s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, malformed("port %q is not 1-65535", s)
		}
		n = n*10 + int(s[i]-'0')
	}
	if n < 1 || n > 65535 {
		return 0, malformed("port %q is not 1-65535", s)
	}
	return n, nil
}

func normalizeHost(h string) (string, error) {
	if strings.HasPrefix(h, "[") || strings.Contains(h, ":") {
		return "", malformed("host %q is an IP literal", h)
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", malformed("host is empty")
	}
	if strings.Contains(h, "%") {
		return "", malformed("host %q is percent-encoded", h)
	}
	h = asciiLower(h)
	a, err := strict.ToASCII(h)
	if err != nil {
		return "", malformed("host %q is not a valid IDNA2008 name: %v", h, err)
	}
	if len(a) > maxHostLen {
		return "", malformed("host is %d octets, more than %d", len(a), maxHostLen)
	}
	labels := strings.Split(a, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", err
		}
	}
	if allDigits(labels[len(labels)-1]) {
		return "", malformed("host %q ends in a numeric label (an IP address is not a front door)", a)
	}
	return a, nil
}

// checkLabel re-checks what the IDNA profile should already guarantee, so
// that the rule does not depend on the profile's options: LDH characters,
// 1-63 octets, no hyphen at either end.
func checkLabel(l string) error {
	if l == "" || len(l) > maxLabelLen {
		return malformed("label %q is empty or longer than %d", l, maxLabelLen)
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return malformed("label %q starts or ends with a hyphen", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return malformed("label %q has a character other than a-z, 0-9 and -", l)
		}
	}
	return nil
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func malformed(format string, args ...any) error {
	return &Refusal{Reason: Malformed, Detail: fmt.Sprintf(format, args...)}
}

// ValidEdge reports whether id can name an edge in a row: 1-64 characters
// of a-z, A-Z, 0-9, '-', '_' and '.'.
func ValidEdge(id string) bool {
	if id == "" || len(id) > maxEdgeLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// IsRefusal reports whether err is a refusal, and which.
func IsRefusal(err error) (Reason, bool) {
	var r *Refusal
	if errors.As(err, &r) {
		return r.Reason, true
	}
	return "", false
}
