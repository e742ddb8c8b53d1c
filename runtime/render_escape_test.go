package runtime

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cellvisor/domain"
)

// hostile are the worst cases a value can bring into a rendered
// configuration: quotes, a Lua comment and code, long brackets, braces (the
// end of nginx's Lua block), a variable, a new line with a directive after
// it, a NUL and bytes that are not UTF-8.
var hostile = []string{
	`shared-x", os.execute("touch PWNED") --`,
	`shared-x\"); os.exit(3) --[[`,
	"shared-x]]..os.exit(4)..[[",
	"shared-x } init_by_lua_block { os.exit(5) }",
	"shared-$host",
	"shared-x\ninclude /etc/passwd;",
	"shared-\x00\xff\x80\\",
	"",
}

// Every hostile value, rendered as a Lua string, reads back in the cell's
// Lua exactly as it was, and runs nothing: nginx parses the block, LuaJIT
// the string.
func TestLuaStringRoundTripsInTheCellsLua(t *testing.T) {
	bin, mods := requireNginx(t)
	dir := t.TempDir()
	var conf strings.Builder
	for _, m := range mods {
		conf.WriteString("load_module " + m + ";\n")
	}
	out := filepath.Join(dir, "out")
	conf.WriteString("pid " + dir + "/nginx.pid;\nerror_log " + dir + "/error.log;\nevents {}\nhttp {\n    init_by_lua_block {\n        local vals = {\n")
	for _, v := range hostile {
		conf.WriteString("            " + luaString(v) + ",\n")
	}
	conf.WriteString("        }\n        local o = assert(io.open(" + luaString(out) + ", \"wb\"))\n" +
		"        for _, v in ipairs(vals) do o:write(#v, \":\", v) end\n        o:close()\n        os.exit(0)\n    }\n}\n")
	runNginxOnce(t, bin, dir, conf.String())
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, v := range hostile {
		want.WriteString(strconv.Itoa(len(v)) + ":" + v)
	}
	if string(got) != want.String() {
		t.Errorf("Lua read back %q, want %q", got, want.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "PWNED")); err == nil {
		t.Error("a rendered value ran as Lua")
	}
}

// Every string field of the configuration either renders as data or stops
// the rendering with the value named: a path or name nginx would read as
// more than one argument, a variable or a comment never reaches nginx.conf.
func TestRenderRefusesOrEscapesEveryField(t *testing.T) {
	base := testParams(Plan(Layout{Slots: 1, HTTPBase: 10080, HTTPSBase: 10443, StateDir: "/var/lib/cellvisor", RunDir: "/run/cellvisor"}).Slots[0], 7)
	base.ReleaseDir = "/var/lib/cellvisor/cells/cell-01/runtime/releases/000000000007"
	base.FrontDoorFile = "/run/cellvisor/frontdoors.json"
	fields := map[string]func(p *RenderParams, v string){
		"slot name":       func(p *RenderParams, v string) { p.Slot.Name = v },
		"slot dir":        func(p *RenderParams, v string) { p.Slot.Dir = "/x/" + v },
		"slot run dir":    func(p *RenderParams, v string) { p.Slot.RunDir = "/x/" + v },
		"release dir":     func(p *RenderParams, v string) { p.ReleaseDir = v },
		"module":          func(p *RenderParams, v string) { p.Modules = []string{v} },
		"user":            func(p *RenderParams, v string) { p.User = v },
		"front door file": func(p *RenderParams, v string) { p.FrontDoorFile = v },
		"address":         func(p *RenderParams, v string) { p.Address = v },
		"pool":            func(p *RenderParams, v string) { p.Pool = v },
	}
	for name, set := range fields {
		for _, v := range hostile[:len(hostile)-1] {
			p := base
			set(&p, v)
			conf, err := RenderConf(p)
			if err != nil {
				if !strings.Contains(err.Error(), "cannot be an nginx argument") && !strings.Contains(err.Error(), "are required") {
					t.Errorf("%s %q: refused without naming why: %v", name, v, err)
				}
				continue
			}
			// Rendered: then only as data. No line of it is a
			// directive the value brought, and every copy of the value
			// is escaped.
			for _, line := range strings.Split(string(conf), "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "include /etc/passwd") {
					t.Errorf("%s %q: rendered a directive of its own: %q", name, v, line)
				}
			}
			if strings.Contains(string(conf), v) {
				t.Errorf("%s %q: rendered as it is", name, v)
			}
		}
	}
}

// A pool name that is not the control plane's kind never becomes a file
// name in a release, even when it comes signed.
func TestBuildReleaseRefusesBadPoolNames(t *testing.T) {
	s := slotFor(t)
	for _, pool := range []string{"shared-../../x", "shared-x/y", "shared-A", "shared-x\n", "shared-" + strings.Repeat("a", domain.MaxPoolName)} {
		p := testParams(s, 1)
		p.Pool = pool
		if _, err := BuildRelease(p, nil); err == nil || !strings.Contains(err.Error(), "not a valid pool name") {
			t.Errorf("pool %q: %v, want a refusal", pool, err)
		}
	}
}
