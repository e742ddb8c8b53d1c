// Package domain owns the configuration model of a customer domain that the
// control plane publishes and the edge serves: the document, its strict
// decoding and validation, hostname rules and pool classes. It is a leaf: it
// imports nothing of the edge host (runtime, supervisor, cgroups) nor of the
// control plane. activation, controlapi, controlapi/acmeissue, manifest and runtime import it,
// on both sides.
package domain

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Bounds of one domain document. An artifact is at most 1 MiB whole; these
// bound what one document may ask of every cell that serves it.
const (
	// MaxHostnames is the most hostnames one domain answers.
	MaxHostnames = 100
	// MaxOrigins is the most origins one domain names.
	MaxOrigins = 32
	// MaxRoutes is the most routes one domain has.
	MaxRoutes = 256
	// MaxPrefix is the longest route prefix, in bytes.
	MaxPrefix = 1024
	// MaxContentType is the longest fixed response content type, in bytes.
	MaxContentType = 256
	// MaxRevision is the highest revision: 2^53-1, the largest integer a
	// JSON number carries exactly (the cells' Lua reads numbers as doubles).
	MaxRevision = 1<<53 - 1
)

// ErrInvalid marks a domain configuration that failed validation.
var ErrInvalid = errors.New("invalid domain configuration")

// Domain is one domain revision's OpenResty configuration: the hostnames it
// answers, its origins, its routes and its cache policy.
type Domain struct {
	Domain    string   `json:"domain"`
	Pool      string   `json:"pool"`
	Revision  int64    `json:"revision"`
	Hostnames []string `json:"hostnames"`
	Origins   []Origin `json:"origins,omitempty"`
	Routes    []Route  `json:"routes"`
	Cache     *Cache   `json:"cache,omitempty"`
	// CaseInsensitive matches route prefixes whatever the case of the
	// request's path (an edge rule on /admin also holds /Admin).
	CaseInsensitive bool `json:"case_insensitive,omitempty"`
	// RawPath sends the origin the path as the client sent it, instead of
	// the normalised path the routes matched (for an origin that tells
	// %2F from /).
	RawPath bool `json:"raw_path,omitempty"`
	// TrustForwarded says the domain's clients are proxies of its own
	// (a load balancer, another CDN) whose X-Forwarded-For and
	// X-Forwarded-Proto are passed on: the edge appends the address it saw
	// to the first and keeps the second. False (the default): both are
	// replaced by what the edge saw, whatever the client sent.
	TrustForwarded bool `json:"trust_forwarded,omitempty"`
	// TLS, when set, serves the domain over HTTPS too (see TLS).
	TLS *TLS `json:"tls,omitempty"`

	// raw is the canonical encoding of this domain, made once when it was
	// decoded and validated: the edge's pool runtime JSON splices it in.
	raw []byte
}

// Origin is an upstream the cell proxies to.
type Origin struct {
	Name string `json:"name"`
	// URL is http(s)://host:port of the origin; host is an IP address or
	// a DNS name the cells resolve (openresty.resolvers). Exactly one of
	// URL and Servers.
	URL string `json:"url,omitempty"`
	// Servers are several servers of one origin, each with a URL as above
	// (one scheme for all) and a weight: requests are spread by weight, a
	// server that keeps failing is skipped for a while, and a failed
	// idempotent request is tried once more on another.
	Servers []OriginServer `json:"servers,omitempty"`
	// TLSVerify, for an https origin, says whether its certificate is
	// verified (against the cells' CA bundle, for SNI's name): true unless
	// set to false, which status reports.
	TLSVerify *bool `json:"tls_verify,omitempty"`
	// SNI is the name sent in the TLS handshake and verified; "" means the
	// URL's host (none for an IP address).
	SNI string `json:"sni,omitempty"`
	// CA, for an https origin, is a PEM bundle of the certificates its
	// certificate is verified against instead of the cells' CA bundle
	// (openresty.origin_ca_file): a private CA, or a self-signed origin's
	// own certificate. At most MaxOriginCA bytes and MaxOriginCACerts
	// certificates.
	CA string `json:"ca,omitempty"`
	// Timeouts bound the exchange with the origin; zero fields take the
	// defaults (connect 5 s, send and read 60 s).
	Timeouts *OriginTimeouts `json:"timeouts,omitempty"`
	// HealthCheck, when set, has the cells ask each server of the origin
	// for a path on an interval: a server that fails it is skipped until
	// it passes again.
	HealthCheck *HealthCheck `json:"health_check,omitempty"`
}

// HealthCheck is an origin's active health check: GET Path on every
// server each IntervalSeconds (2–300; 0 means 10), a pass being an answer
// of 200–399 within TimeoutMs (100–10000; 0 means 1000).
type HealthCheck struct {
	Path            string `json:"path"`
	IntervalSeconds int    `json:"interval_seconds,omitempty"`
	TimeoutMs       int    `json:"timeout_ms,omitempty"`
}

// OriginServer is one server of an origin.
type OriginServer struct {
	URL string `json:"url"`
	// Weight is the server's share of requests, 1–100; 0 means 1.
	Weight int `json:"weight,omitempty"`
}

// MaxOriginServers is the most servers one origin has.
const MaxOriginServers = 16

// URLs are the origin's server URLs: its URL, or each server's.
func (o Origin) URLs() []string {
	if len(o.Servers) == 0 {
		return []string{o.URL}
	}
	out := make([]string, len(o.Servers))
	for i, sv := range o.Servers {
		out[i] = sv.URL
	}
	return out
}

// OriginTimeouts bound an origin's connect, the sending of a request to it
// and each read of its answer, in milliseconds.
type OriginTimeouts struct {
	ConnectMs int `json:"connect_ms,omitempty"`
	SendMs    int `json:"send_ms,omitempty"`
	ReadMs    int `json:"read_ms,omitempty"`
}

// Bounds of an origin's timeouts, in milliseconds.
const (
	MinOriginTimeoutMs = 100
	MaxConnectMs       = 60_000
	MaxSendReadMs      = 600_000
)

// ChecksTLS reports whether the origin has an active health check of https
// servers (the cells then load their CA bundle for the checks too).
func (o Origin) ChecksTLS() bool {
	if o.HealthCheck == nil {
		return false
	}
	for _, u := range o.URLs() {
		if strings.HasPrefix(u, "https://") {
			return true
		}
	}
	return false
}

// Verified reports whether an https origin's certificate is verified.
func (o Origin) Verified() bool { return o.TLSVerify == nil || *o.TLSVerify }

// Route maps a path prefix to a fixed response or an origin.
type Route struct {
	// Prefix is the path prefix, starting with "/".
	Prefix string `json:"prefix"`
	// Respond answers directly.
	Respond *Response `json:"respond,omitempty"`
	// Origin names one of the domain's origins to proxy to.
	Origin string `json:"origin,omitempty"`
}

// Response is a fixed answer.
type Response struct {
	Status      int    `json:"status"`
	Body        string `json:"body"`
	ContentType string `json:"content_type,omitempty"`
}

// Cache is the domain's cache policy for proxied responses.
type Cache struct {
	TTLSeconds int `json:"ttl_seconds"`
	// IgnoreCookies are cookies that do not personalise an answer (a
	// consent flag, an analytics id): a request whose cookies are all
	// among them reads and fills the cache; any other cookie keeps it
	// from both. At most MaxIgnoreCookies names.
	IgnoreCookies []string `json:"ignore_cookies,omitempty"`
}

// MaxIgnoreCookies is the most cookie names a cache ignores.
const MaxIgnoreCookies = 32

// ValidHostname reports whether h is a lowercase DNS name (an optional
// leading "*." wildcard label allowed), at most 253 characters: labels of
// 1–63 lowercase letters, digits and inner hyphens. Hand-written rather than
// a regexp: it runs several times for every artifact of every activation.
func ValidHostname(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	if len(h) > 2 && h[0] == '*' && h[1] == '.' {
		h = h[2:]
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			label++
		case c == '-':
			if label == 0 || i+1 == len(h) || h[i+1] == '.' {
				return false
			}
			label++
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		default:
			return false
		}
		if label > 63 {
			return false
		}
	}
	return label > 0
}

// Decode strictly decodes and validates one domain document.
func Decode(data []byte) (Domain, error) {
	var d Domain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Domain{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return Domain{}, fmt.Errorf("%w: trailing data after the document", ErrInvalid)
	}
	if err := d.Validate(); err != nil {
		return Domain{}, err
	}
	// The cells read the canonical encoding of what was validated, never the
	// input: Go matches JSON keys case-insensitively and keeps the last of
	// duplicate keys, the cells' Lua does neither.
	raw, err := json.Marshal(d)
	if err != nil {
		return Domain{}, err
	}
	d.raw = raw
	return d, nil
}

// Validate checks every field.
func (d Domain) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, d.Domain, fmt.Sprintf(format, args...))
	}
	if !ValidHostname(d.Domain) || strings.HasPrefix(d.Domain, "*.") {
		return fmt.Errorf("%w: domain %q is not a valid hostname", ErrInvalid, d.Domain)
	}
	if _, ok := PoolClass(d.Pool); !ok {
		return bad("pool %q is not a shared-, reserved-, dedicated- or quarantine- pool", d.Pool)
	}
	if d.Revision < 1 || d.Revision > MaxRevision {
		return bad("revision must be 1–%d, got %d", int64(MaxRevision), d.Revision)
	}
	if err := d.validateHostnames(); err != nil {
		return bad("%v", err)
	}
	origins, err := d.validateOrigins()
	if err != nil {
		return bad("%v", err)
	}
	if err := d.validateRoutes(origins); err != nil {
		return bad("%v", err)
	}
	if d.Cache != nil && len(d.Cache.IgnoreCookies) > MaxIgnoreCookies {
		return bad("cache ignore_cookies: at most %d, got %d", MaxIgnoreCookies, len(d.Cache.IgnoreCookies))
	}
	if d.Cache != nil {
		for _, c := range d.Cache.IgnoreCookies {
			if !validCookieName(c) {
				return bad("cache ignore_cookies: %q is not a cookie name (1–64 of letters, digits and !#$%%&'*+-.^_`|~)", c)
			}
		}
	}
	if d.TLS != nil {
		if err := d.TLS.validate(); err != nil {
			return bad("%v", err)
		}
	}
	if d.Cache != nil && (d.Cache.TTLSeconds < 0 || d.Cache.TTLSeconds > 86400*365) {
		return bad("cache ttl_seconds must be 0–31536000, got %d", d.Cache.TTLSeconds)
	}
	return nil
}

func (d Domain) validateHostnames() error {
	switch {
	case len(d.Hostnames) == 0:
		return errors.New("hostnames: at least one is required")
	case len(d.Hostnames) > MaxHostnames:
		return fmt.Errorf("hostnames: at most %d, got %d", MaxHostnames, len(d.Hostnames))
	}
	seen := make(map[string]bool, len(d.Hostnames))
	for _, h := range d.Hostnames {
		if !ValidHostname(h) {
			return fmt.Errorf("hostname %q is not a valid lowercase DNS name", h)
		}
		if seen[h] {
			return fmt.Errorf("hostname %s is listed twice", h)
		}
		seen[h] = true
	}
	return nil
}

// validateOrigins checks every origin and returns the set of their names.
func (d Domain) validateOrigins() (map[string]bool, error) {
	if len(d.Origins) > MaxOrigins {
		return nil, fmt.Errorf("origins: at most %d, got %d", MaxOrigins, len(d.Origins))
	}
	origins := make(map[string]bool, len(d.Origins))
	for _, o := range d.Origins {
		if !validName(o.Name) || origins[o.Name] {
			return nil, fmt.Errorf("origin names must be unique, 1–64 of a-z 0-9 _ -, got %q", o.Name)
		}
		scheme, err := o.validateServers()
		if err != nil {
			return nil, fmt.Errorf("origin %s: %w", o.Name, err)
		}
		if err := o.validateTLS(scheme); err != nil {
			return nil, fmt.Errorf("origin %s: %w", o.Name, err)
		}
		if t := o.Timeouts; t != nil {
			for _, f := range []struct {
				name   string
				ms, mx int
			}{{"connect_ms", t.ConnectMs, MaxConnectMs}, {"send_ms", t.SendMs, MaxSendReadMs}, {"read_ms", t.ReadMs, MaxSendReadMs}} {
				if f.ms != 0 && (f.ms < MinOriginTimeoutMs || f.ms > f.mx) {
					return nil, fmt.Errorf("origin %s: timeouts.%s must be %d–%d (or 0 for the default), got %d", o.Name, f.name, MinOriginTimeoutMs, f.mx, f.ms)
				}
			}
		}
		if hc := o.HealthCheck; hc != nil {
			switch {
			case !strings.HasPrefix(hc.Path, "/") || len(hc.Path) > MaxPrefix || !printable(hc.Path) || strings.ContainsAny(hc.Path, " #"):
				return nil, fmt.Errorf("origin %s: health_check.path must start with / and be at most %d printable bytes without spaces or #, got %q", o.Name, MaxPrefix, hc.Path)
			case hc.IntervalSeconds != 0 && (hc.IntervalSeconds < 2 || hc.IntervalSeconds > 300):
				return nil, fmt.Errorf("origin %s: health_check.interval_seconds must be 2–300 (or 0 for 10), got %d", o.Name, hc.IntervalSeconds)
			case hc.TimeoutMs != 0 && (hc.TimeoutMs < MinOriginTimeoutMs || hc.TimeoutMs > 10_000):
				return nil, fmt.Errorf("origin %s: health_check.timeout_ms must be %d–10000 (or 0 for 1000), got %d", o.Name, MinOriginTimeoutMs, hc.TimeoutMs)
			}
		}
		origins[o.Name] = true
	}
	return origins, nil
}

// validateServers checks the origin's URL or servers and returns their
// scheme.
func (o Origin) validateServers() (string, error) {
	switch {
	case (o.URL == "") == (len(o.Servers) == 0):
		return "", fmt.Errorf("exactly one of url and servers is required")
	case len(o.Servers) > MaxOriginServers:
		return "", fmt.Errorf("servers: at most %d, got %d", MaxOriginServers, len(o.Servers))
	}
	scheme := ""
	seen := map[string]bool{}
	for i, raw := range o.URLs() {
		// Only scheme://host[:port]: user-info would put credentials in
		// every cell's runtime JSON and logs, and a path, query or
		// fragment means something the cell does not do.
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" ||
			u.User != nil || u.Path != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#") {
			return "", fmt.Errorf("url %q must be http(s)://host[:port], with no user-info, path, query or fragment", raw)
		}
		if err := validOriginHost(u); err != nil {
			return "", fmt.Errorf("url %q: %w", raw, err)
		}
		if scheme != "" && u.Scheme != scheme {
			return "", fmt.Errorf("servers: one scheme for all, got %s and %s", scheme, u.Scheme)
		}
		if seen[raw] {
			return "", fmt.Errorf("servers: %s twice", raw)
		}
		scheme, seen[raw] = u.Scheme, true
		if len(o.Servers) > 0 {
			if w := o.Servers[i].Weight; w < 0 || w > 100 {
				return "", fmt.Errorf("servers: weight of %s must be 1–100 (0 means 1), got %d", raw, w)
			}
		}
	}
	return scheme, nil
}

// validOriginHost checks an origin URL's host and port: an IP address or
// a DNS name (what a resolver can be asked), a port 1–65535 if given.
func validOriginHost(u *url.URL) error {
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port must be 1–65535")
		}
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil {
		if strings.Contains(host, ":") != strings.HasPrefix(u.Host, "[") {
			return fmt.Errorf("an IPv6 address must be in brackets")
		}
		return nil
	}
	if !validDNSName(host) {
		return fmt.Errorf("host %q is neither an IP address nor a DNS name (labels of a-z 0-9 -, at most 253 characters)", host)
	}
	return nil
}

// validDNSName is a name of lowercase LDH labels of 1–63 characters,
// neither starting nor ending with '-', 253 characters at most.
func validDNSName(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// validateTLS checks an origin's TLS settings: only for https, an SNI
// that is a DNS name, a CA bundle of certificates for a verified origin.
func (o Origin) validateTLS(scheme string) error {
	if scheme != "https" && (o.TLSVerify != nil || o.SNI != "" || o.CA != "") {
		return fmt.Errorf("tls_verify, sni and ca are for https origins")
	}
	if o.SNI != "" && !validDNSName(o.SNI) {
		return fmt.Errorf("sni %q must be a DNS name (labels of a-z 0-9 -)", o.SNI)
	}
	if o.CA == "" {
		return nil
	}
	if !o.Verified() {
		return fmt.Errorf("ca: an origin with tls_verify false verifies nothing; drop one of them")
	}
	return validCABundle(o.CA)
}

// Bounds of an origin's CA bundle.
const (
	MaxOriginCA      = 64 << 10
	MaxOriginCACerts = 100
)

// validCABundle checks a CA bundle: PEM CERTIFICATE blocks, each a
// certificate Go parses, and no text after the last.
func validCABundle(bundle string) error {
	if len(bundle) > MaxOriginCA {
		return fmt.Errorf("ca: %d bytes, at most %d", len(bundle), MaxOriginCA)
	}
	rest, n := []byte(bundle), 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		n++
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("ca: block %d is a %q, want only CERTIFICATE blocks", n, b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("ca: certificate %d: %v", n, err)
		}
	}
	switch {
	case n == 0:
		return errors.New("ca: no PEM certificate in it")
	case n > MaxOriginCACerts:
		return fmt.Errorf("ca: %d certificates, at most %d", n, MaxOriginCACerts)
	case strings.TrimSpace(string(rest)) != "":
		return errors.New("ca: holds text that is not a PEM certificate")
	}
	return nil
}

func (d Domain) validateRoutes(origins map[string]bool) error {
	switch {
	case len(d.Routes) == 0:
		return errors.New("routes: at least one is required")
	case len(d.Routes) > MaxRoutes:
		return fmt.Errorf("routes: at most %d, got %d", MaxRoutes, len(d.Routes))
	}
	for _, r := range d.Routes {
		if !strings.HasPrefix(r.Prefix, "/") || len(r.Prefix) > MaxPrefix || !printable(r.Prefix) || strings.Contains(r.Prefix, " ") {
			return fmt.Errorf("route prefix %q must start with /, be at most %d bytes and hold no spaces or control characters", r.Prefix, MaxPrefix)
		}
		switch {
		case (r.Respond == nil) == (r.Origin == ""):
			return fmt.Errorf("route %s: exactly one of respond and origin is required", r.Prefix)
		case r.Respond != nil && (r.Respond.Status < 100 || r.Respond.Status > 599):
			return fmt.Errorf("route %s: status %d is not 100–599", r.Prefix, r.Respond.Status)
		case r.Respond != nil && (len(r.Respond.ContentType) > MaxContentType || !printable(r.Respond.ContentType)):
			// It becomes a response header: a control character would
			// split it (header injection).
			return fmt.Errorf("route %s: content_type must be at most %d bytes of printable ASCII", r.Prefix, MaxContentType)
		case r.Origin != "" && !origins[r.Origin]:
			return fmt.Errorf("route %s: unknown origin %q", r.Prefix, r.Origin)
		}
	}
	return nil
}

// validCookieName is an RFC 6265 token of 1–64 characters.
func validCookieName(c string) bool {
	if c == "" || len(c) > 64 {
		return false
	}
	for i := 0; i < len(c); i++ {
		b := c[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return true
}

// printable reports whether s is printable ASCII (space to tilde).
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// validName reports 1–64 bytes of lowercase letters, digits, '_' and '-'.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Canonical is the canonical JSON encoding of a domain made by Decode (nil
// for a Domain built in code): what the cells read, never the input bytes.
func (d *Domain) Canonical() []byte { return d.raw }
