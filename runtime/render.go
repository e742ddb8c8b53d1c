package runtime

import (
	"bytes"
	_ "embed"
	"fmt"
	"net"
	"strconv"
	"sync"
	"text/template"
)

//go:embed lua/cellvisor.lua
var cellLua []byte

//go:embed lua/frontdoor.lua
var frontDoorLua []byte

//go:embed nginx.conf.tmpl
var nginxTmpl string

// confTemplate is parsed when first rendered, not in the package's
// initialiser: an enrolled agent whose releases are in place renders
// nothing when it starts, and every initialiser runs before its first cell.
var confTemplate = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("nginx.conf").Parse(nginxTmpl))
})

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
	CacheMaxBytes         int64
	RequestMaxBytes       int64
	// Limits are the slot's pool limits the cell enforces; zero values
	// mean none.
	Limits PoolLimits
	// CacheTTLs are the distinct cache TTLs, in seconds, of the slot's
	// domains, ascending: each gets a cached origin location. BuildRelease
	// fills them from the pool runtime.
	CacheTTLs []int
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

// DefaultAuthWindow is the private endpoint's timestamp window, in seconds.
const DefaultAuthWindow = 30

// AuthWindowSeconds is AuthWindow with its default.
func (p RenderParams) AuthWindowSeconds() int {
	if p.AuthWindow <= 0 {
		return DefaultAuthWindow
	}
	return p.AuthWindow
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
