package runtime

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/frontdoor"
)

// fixture is the golden file the Go resolver generated
// (go test ./frontdoor -run TestFixture -update).
var fixture = filepath.Join("..", "frontdoor", "testdata", "cases.json")

type luaCase struct {
	Name      string          `json:"name"`
	URL       string          `json:"url"`
	Rows      []frontdoor.Row `json:"rows"`
	Edge      string          `json:"edge"`
	Reason    string          `json:"reason"`
	Canonical string          `json:"canonical"`
	LuaReason string          `json:"lua_reason"`
}

// TestFrontdoorLuaFixture runs every case of the Go resolver's golden file
// through lua/frontdoor.lua inside a real nginx (its init_by_lua, under
// which writes the answers and exits before nginx serves anything) and requires the same
// answer: the edge, or the same refusal reason, and the same canonical form.
func TestFrontdoorLuaFixture(t *testing.T) {
	bin, mods := requireNginx(t)
	dir := t.TempDir()
	luaDir, err := filepath.Abs("lua")
	if err != nil {
		t.Fatal(err)
	}
	fix, err := filepath.Abs(fixture)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.json")
	var conf strings.Builder
	for _, m := range mods {
		conf.WriteString("load_module " + m + ";\n")
	}
	conf.WriteString(`pid ` + dir + `/nginx.pid;
error_log ` + dir + `/error.log;
events {}
http {
    lua_package_path "` + luaDir + `/?.lua;;";
    init_by_lua_block {
        local fd = require "frontdoor"
        local cjson = require "cjson.safe"
        local f = assert(io.open("` + fix + `", "rb"))
        local cases = assert(cjson.decode(f:read("*a")))
        f:close()
        local results = {}
        for i, c in ipairs(cases) do
            local rows = type(c.rows) == "table" and c.rows or {}
            local edge, reason = fd.decide(c.url, rows)
            results[i] = { name = c.name, edge = edge or "", reason = reason or "",
                canonical = fd.normalize(c.url) or "" }
        end
        -- resolve() through runtime files: good rows, undecodable, missing.
        local files = {}
        for _, f in ipairs({ "good.json", "bad.json", "missing.json", "fifo.json", "link-to-fifo.json", "huge.json", "dir.json" }) do
            fd.init({ rows_file = "` + dir + `/" .. f })
            for _, u in ipairs({ "https://Shop.example.com/x", "https://nobody.example.com", "mailto:x" }) do
                local edge, reason = fd.resolve(u)
                files[#files + 1] = f .. " " .. u .. " " .. (edge or "") .. (reason or "")
            end
        end
        results = { cases = results, files = files }
        local o = assert(io.open("` + out + `", "wb"))
        o:write(cjson.encode(results))
        o:close()
        -- The answers are written: stop here, before nginx serves.
        os.exit(0)
    }
}
`)
	os.WriteFile(filepath.Join(dir, "good.json"), []byte(`{"org":"acme","rows":[{"edge":"edge-a","url":"https://shop.example.com:443"}]}`), 0o644)
	os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"org":"acme","rows":[{"edge":`), 0o644)
	// Put in the file's place: a FIFO (no writer ever comes: opening it
	// for reading would block the worker), a link to one, a file over the
	// bound, a directory. Each refuses as a file that cannot be read.
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "fifo.json"), filepath.Join(dir, "link-to-fifo.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "huge.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "huge.json"), 4<<20+1); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "dir.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	runNginxOnce(t, bin, dir, conf.String())
	var want []luaCase
	readJSON(t, fix, &want)
	var res struct {
		Cases []luaCase `json:"cases"`
		Files []string  `json:"files"`
	}
	readJSON(t, out, &res)
	got := res.Cases
	wantFiles := []string{
		"good.json https://Shop.example.com/x edge-a",
		"good.json https://nobody.example.com unmapped",
		"good.json mailto:x malformed",
		"bad.json https://Shop.example.com/x corrupt_row",
		"bad.json https://nobody.example.com corrupt_row",
		"bad.json mailto:x malformed",
		"missing.json https://Shop.example.com/x corrupt_row",
		"missing.json https://nobody.example.com corrupt_row",
		"missing.json mailto:x malformed",
	}
	for _, f := range []string{"fifo.json", "link-to-fifo.json", "huge.json", "dir.json"} {
		wantFiles = append(wantFiles, f+" https://Shop.example.com/x corrupt_row", f+" https://nobody.example.com corrupt_row", f+" mailto:x malformed")
	}
	if strings.Join(res.Files, "\n") != strings.Join(wantFiles, "\n") {
		t.Errorf("resolve through runtime files:\n%s\nwant:\n%s", strings.Join(res.Files, "\n"), strings.Join(wantFiles, "\n"))
	}
	if len(got) != len(want) {
		t.Fatalf("lua answered %d cases, the fixture has %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if w.LuaReason != "" {
			// A known difference (the IDNA tables): another refusal, never an edge.
			if g.Edge != "" || g.Reason != w.LuaReason {
				t.Errorf("%s: lua resolve(%q) = edge %q reason %q; want the known difference: reason %q (go: %q)", w.Name, w.URL, g.Edge, g.Reason, w.LuaReason, w.Reason)
			}
			continue
		}
		if g.Edge != w.Edge || g.Reason != w.Reason || g.Canonical != w.Canonical {
			t.Errorf("%s: lua resolve(%q) = edge %q reason %q canonical %q; go: edge %q reason %q canonical %q",
				w.Name, w.URL, g.Edge, g.Reason, g.Canonical, w.Edge, w.Reason, w.Canonical)
		}
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
}

// runNginxOnce writes conf into dir and runs nginx on it without a master
// (its init_by_lua does the work and exits), bounded in time; it fails the
// test with nginx's output and error log when nginx fails.
func runNginxOnce(t *testing.T, bin, dir, conf string) {
	t.Helper()
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-g", "daemon off; master_process off;", "-e", filepath.Join(dir, "error.log"), "-p", dir, "-c", confPath)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		logb, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Fatalf("nginx: %v\n%s\n%s\n%s", err, b, logb, conf)
	}
}

func requireNginx(t *testing.T) (string, []string) {
	t.Helper()
	bin, mods, err := FindOpenResty()
	if err != nil {
		t.Skipf("needs OpenResty or nginx with the Lua module: %v (make deps installs it)", err)
	}
	return bin, mods
}
