package agent

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The cells ask the host's nameservers unless openresty.resolvers says
// otherwise: v4 as they are, v6 in brackets with the port, link-local
// ones with a zone (which a cell cannot use) and anything else left out.
func TestHostResolvers(t *testing.T) {
	f := filepath.Join(t.TempDir(), "resolv.conf")
	conf := "# generated\nsearch example.com\nnameserver 127.0.0.53\nnameserver 2001:db8::1\nnameserver fe80::1%eth0\nnameserver not-an-address\noptions edns0\n"
	if err := os.WriteFile(f, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	old := resolvConf
	resolvConf = f
	t.Cleanup(func() { resolvConf = old })
	if got, want := hostResolvers(), []string{"127.0.0.53", "[2001:db8::1]:53"}; !slices.Equal(got, want) {
		t.Errorf("resolvers %v, want %v", got, want)
	}
	resolvConf = filepath.Join(t.TempDir(), "missing")
	if got := hostResolvers(); got != nil {
		t.Errorf("no resolv.conf: %v, want none", got)
	}
}
