// Package domain owns the configuration model of a customer domain that the
// control plane publishes and the edge serves: the document, its strict
// decoding and validation, hostname rules and pool classes. It is a leaf: it
// imports nothing of the edge host (runtime, supervisor, cgroups) nor of the
// control plane, and both sides import it.
package domain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
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

	// raw is the canonical encoding of this domain, made once when it was
	// decoded and validated: the edge's pool runtime JSON splices it in.
	raw []byte
}

// Origin is an upstream the cell proxies to.
type Origin struct {
	Name string `json:"name"`
	// URL is http(s)://host:port of the origin.
	URL string `json:"url"`
}

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
}

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
	if d.Revision < 1 {
		return bad("revision must be at least 1, got %d", d.Revision)
	}
	if len(d.Hostnames) == 0 {
		return bad("hostnames: at least one is required")
	}
	for _, h := range d.Hostnames {
		if !ValidHostname(h) {
			return bad("hostname %q is not a valid lowercase DNS name", h)
		}
	}
	origins := map[string]bool{}
	for _, o := range d.Origins {
		u, err := url.Parse(o.URL)
		if o.Name == "" || origins[o.Name] {
			return bad("origin names must be unique and non-empty, got %q", o.Name)
		}
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			return bad("origin %s: url %q must be http(s)://host[:port]", o.Name, o.URL)
		}
		origins[o.Name] = true
	}
	if len(d.Routes) == 0 {
		return bad("routes: at least one is required")
	}
	for _, r := range d.Routes {
		if !strings.HasPrefix(r.Prefix, "/") {
			return bad("route prefix %q must start with /", r.Prefix)
		}
		switch {
		case (r.Respond == nil) == (r.Origin == ""):
			return bad("route %s: exactly one of respond and origin is required", r.Prefix)
		case r.Respond != nil && (r.Respond.Status < 100 || r.Respond.Status > 599):
			return bad("route %s: status %d is not 100–599", r.Prefix, r.Respond.Status)
		case r.Origin != "" && !origins[r.Origin]:
			return bad("route %s: unknown origin %q", r.Prefix, r.Origin)
		}
	}
	if d.Cache != nil && (d.Cache.TTLSeconds < 0 || d.Cache.TTLSeconds > 86400*365) {
		return bad("cache ttl_seconds must be 0–31536000, got %d", d.Cache.TTLSeconds)
	}
	return nil
}

// Canonical is the canonical JSON encoding of a domain made by Decode (nil
// for a Domain built in code): what the cells read, never the input bytes.
func (d *Domain) Canonical() []byte { return d.raw }
