package runtime

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
)

// debianModules are the dynamic modules Debian's nginx needs for Lua, in load order.
var debianModules = []string{"ndk_http_module.so", "ngx_http_lua_module.so"}

// FindOpenResty locates an OpenResty-compatible binary on this host: an
// openresty binary (Lua built in), or else nginx with Debian's dynamic Lua
// module (libnginx-mod-http-lua), returning the modules to load with it.
func FindOpenResty() (binary string, modules []string, err error) {
	for _, c := range []string{"openresty", "/usr/local/openresty/bin/openresty"} {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil, nil
		}
	}
	p, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			return "", nil, errors.New("no openresty or nginx binary found (install openresty, or nginx-core with libnginx-mod-http-lua)")
		}
		p = "/usr/sbin/nginx"
	}
	for _, m := range debianModules {
		path := filepath.Join("/usr/share/nginx/modules", m)
		if _, err := os.Stat(path); err != nil {
			return "", nil, errors.New("nginx found but not its Lua module " + path + " (install libnginx-mod-http-lua)")
		}
		modules = append(modules, path)
	}
	return p, modules, nil
}
