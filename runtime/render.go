package runtime

import (
	"bytes"
	_ "embed"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/template"
)

//go:embed lua/cellvisor.lua
var cellLua []byte

//go:embed lua/frontdoor.lua
var frontDoorLua []byte

//go:embed lua/cvfile.lua
var fileLua []byte

//go:embed lua/cvdns.lua
var dnsLua []byte

//go:embed nginx.conf.tmpl
var nginxTmpl string

// confTemplate is parsed when first rendered, not in the package's
// initialiser: an enrolled agent whose releases are in place renders
// nothing when it starts, and every initialiser runs before its first cell.
var confTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("nginx.conf").Funcs(template.FuncMap{
		"lua":      luaString,
		"ngx":      ngxArg,
		"ngxWords": ngxArgs,
		"comment":  commentText,
		"originLocation": func(verify bool, p RenderParams) map[string]any {
			return map[string]any{"Verify": verify, "P": p}
		},
		// An origin verified against its domain's own CA bundle.
		"originCALocation": func(name string, p RenderParams) map[string]any {
			return map[string]any{"Verify": true, "P": p, "CAFile": filepath.Join(p.ReleaseDir, originCADir, name+".pem")}
		},
	}).Parse(nginxTmpl))
})

// Every string the template renders goes through one of these, by the
// context it lands in: a value the signing key, a configuration file or a
// path brings must stay data, never become Lua code or an nginx directive.

// luaString is s as a Lua string literal, quotes included: every byte
// outside a plain set written as a decimal escape, so that nothing in it can
// end the string, start a comment or a long bracket, or reach nginx's lexer
// of the Lua block as a brace.
func luaString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if plainByte(c) {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "\\%03d", c)
	}
	b.WriteByte('"')
	return b.String()
}

// ngxArg returns s to be rendered as (part of) an nginx directive's
// argument, quoted or not, or an error where s holds a byte nginx would
// read as anything but part of one argument: white space, quotes, ';',
// braces, '$' (a variable), '#' (a comment), a backslash or a control byte.
// An error stops the rendering: the cell keeps its previous release.
func ngxArg(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("an empty value cannot be an nginx argument")
	}
	for i := 0; i < len(s); i++ {
		if !plainByte(s[i]) {
			return "", fmt.Errorf("%q cannot be an nginx argument: byte %q (allowed: letters, digits and %s)", s, s[i], plainPunct)
		}
	}
	return s, nil
}

// ngxArgs is ngxArg for each of the words of s separated by single spaces:
// several arguments of one directive ("user group").
func ngxArgs(s string) (string, error) {
	for _, w := range strings.Split(s, " ") {
		if _, err := ngxArg(w); err != nil {
			return "", err
		}
	}
	return s, nil
}

// commentText is s for a comment line: bytes outside the plain set are
// written as '?', so that nothing in it ends the comment.
func commentText(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !plainByte(c) {
			b[i] = '?'
		}
	}
	return string(b)
}

// plainPunct is the punctuation a rendered value may hold as it is.
const plainPunct = "/._-:@+=,[]"

// plainByte reports a letter, a digit or one of plainPunct.
func plainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(plainPunct, c) >= 0
}

// RenderParams are the inputs of a cell's nginx.conf.
type RenderParams struct {
	Slot Slot
	// Pool is the slot's pool ("" renders a cell that serves no domain).
	Pool string
	// ReleaseDir is the concrete release directory the config belongs to.
	ReleaseDir string
	Sequence   int64
	// Address the public listeners bind ("" for all addresses).
	Address string
	// Modules are load_module paths (nginx with dynamic Lua); empty for openresty.
	Modules []string
	// User, when set, renders a user directive (only meaningful as root).
	User                  string
	WorkerConnections     int
	WorkerShutdownTimeout int // seconds
	// WorkerNofile is the worker's open file limit (worker_rlimit_nofile);
	// 0 renders none.
	WorkerNofile int
	// ExposeCell adds X-Cellvisor-Cell to the cell's own answers.
	ExposeCell bool
	// ClientHeaderTimeout, ClientBodyTimeout and SendTimeout are nginx's
	// timeouts with clients, in seconds; 0 means 10.
	ClientHeaderTimeout, ClientBodyTimeout, SendTimeout int
	CacheMaxBytes                                       int64
	// CacheBudgetBytes is limits.cache: the cell stores no answer past
	// it (the Lua, from the agent's measure in Slot.CacheUseFile).
	CacheBudgetBytes int64
	// OriginCAs are the names of the CA bundles of the pool's https
	// origins that carry their own (origin-ca/NAME.pem in the release;
	// BuildRelease sets them from the pool runtime): each has a location
	// that verifies against it.
	OriginCAs       []string
	RequestMaxBytes int64
	// Limits are the slot's pool limits the cell enforces; zero values
	// mean none.
	Limits PoolLimits
	// ChecksTLS loads OriginCAFile for the Lua's active health checks of
	// https origins too: where one of the slot's domains has one
	// (BuildRelease sets it from the pool runtime).
	ChecksTLS bool
	// Cache renders the cache zone and the cached origin location: where
	// one of the slot's domains has a cache TTL (BuildRelease sets it from
	// the pool runtime). The TTLs themselves are data.
	Cache bool
	// MaxDataBytes bounds the pool runtime a cell reads (its data); 0
	// means DefaultMaxDataBytes.
	MaxDataBytes int64
	// Resolvers are the DNS servers the cell asks for origin names
	// ("address" or "address:port"); none: names do not resolve.
	Resolvers []string
	// OriginCAFile is the CA bundle https origins are verified against;
	// "" renders none (every verified https origin fails).
	OriginCAFile string
	// AuthWindow is how far, in seconds, a private call's timestamp may be
	// from the cell's clock either way; 0 means DefaultAuthWindow.
	AuthWindow int
	// FrontDoorFile is the agent's runtime file of the org's front doors
	// that lua/frontdoor.lua resolves against; "" for none (every resolve
	// refuses).
	FrontDoorFile string
}

// PoolLimits are what every cell of a pool enforces: concurrent client
// connections (503 past MaxConns) and requests per second per client
// address (429 past Rate after Burst). Zero means no limit.
type PoolLimits struct {
	MaxConns int `json:"max_conns"`
	Rate     int `json:"rate"`
	Burst    int `json:"burst"`
}

// MinSharedConns is the smallest MaxConns that is shared out: below it a
// pool's limit is the cell's alone (a share of a handful of connections
// would refuse ordinary clients).
const MinSharedConns = 16

// HostShare is the most connections one of the cell's domains may hold of
// MaxConns: three quarters, so that clients of one tenant (an attack on it
// included) leave a quarter to the others; 0 where not shared.
func (l PoolLimits) HostShare() int {
	if l.MaxConns < MinSharedConns {
		return 0
	}
	return l.MaxConns - l.MaxConns/4
}

// AddrShare is the most connections one client address may hold of
// MaxConns: an eighth; 0 where not shared.
func (l PoolLimits) AddrShare() int {
	if l.MaxConns < MinSharedConns {
		return 0
	}
	return l.MaxConns / 8
}

// DefaultMaxDataBytes is the largest pool runtime a cell reads: what
// 10,000 domains take with room to spare (docs/performance.md), within a
// budget of the cell's memory that leaves the rest to connections.
const DefaultMaxDataBytes = 64 << 20

// MaxData is MaxDataBytes with its default.
func (p RenderParams) MaxData() int64 {
	if p.MaxDataBytes <= 0 {
		return DefaultMaxDataBytes
	}
	return p.MaxDataBytes
}

// DefaultAuthWindow is the private endpoint's timestamp window, in seconds.
const DefaultAuthWindow = 30

// AuthWindowSeconds is AuthWindow with its default.
func (p RenderParams) AuthWindowSeconds() int {
	if p.AuthWindow <= 0 {
		return DefaultAuthWindow
	}
	return p.AuthWindow
}

// ClientTimeouts are the client timeouts with their defaults: header, body,
// send, in seconds.
func (p RenderParams) ClientTimeouts() [3]int {
	t := [3]int{p.ClientHeaderTimeout, p.ClientBodyTimeout, p.SendTimeout}
	for i := range t {
		if t[i] <= 0 {
			t[i] = 10
		}
	}
	return t
}

// Listen is the listen argument for a port.
func (p RenderParams) Listen(port int) string {
	if p.Address == "" {
		return strconv.Itoa(port)
	}
	return net.JoinHostPort(p.Address, strconv.Itoa(port))
}

// RenderConf renders a cell's nginx.conf.
func RenderConf(p RenderParams) ([]byte, error) {
	if p.Slot.Name == "" || p.ReleaseDir == "" {
		return nil, fmt.Errorf("render nginx.conf: slot and release dir are required")
	}
	var b bytes.Buffer
	if err := confTemplate().Execute(&b, p); err != nil {
		return nil, fmt.Errorf("render nginx.conf for %s: %w", p.Slot.Name, err)
	}
	return b.Bytes(), nil
}
