// Package deptest keeps the project's layering true. Its table
// (table_test.go) places every package of the module on a floor (util,
// model, host, cells, agent, control, build, cmd) and names who may
// import it; TestTable fails on an import the table does not allow and on
// a package it does not place, and TestPackageDocs keeps the "who imports
// it" sentence of every package comment true. The older rules check what
// each binary links (go list -deps): the edge agent linking the control
// plane or a database driver, the control plane linking the edge's
// runtime, the shared models reaching into the host, or a part of the
// control API (adminapi, fleet, lease, snapcache, ...) linking the server
// that wires it. It has tests only.
package deptest

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "cellvisor/"

// Host-side packages: they touch this host's processes, cgroups, files or
// cells. The shared models (domain, manifest, edgeapi) must link none of them.
var hostSide = []string{
	"cellvisor/runtime", "cellvisor/supervisor", "cellvisor/adminsock", "cellvisor/cgroup", "cellvisor/activation",
	"cellvisor/agent", "cellvisor/logbound", "cellvisor/cellapi", "cellvisor/config",
	"cellvisor/systemd", "cellvisor/controlclient", "cellvisor/sdscope",
}

// The control plane and the database drivers only it needs.
var controlPlane = []string{
	"cellvisor/controlapi", "modernc.org/sqlite", "github.com/jackc/pgx/v5",
}

// The package builder and nfpm: build tools, linked by packaging/cmd/mkpkg only.
var packaging = []string{"cellvisor/packaging", "github.com/goreleaser/nfpm"}

func TestLayering(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to list dependencies: %v", err)
	}
	rules := []struct {
		pkg       string
		forbidden []string
		why       string
	}{
		{"./domain", append(append([]string{"cellvisor/manifest", "cellvisor/edgeapi"}, hostSide...), controlPlane...),
			"the domain model is a leaf both sides import"},
		{"./manifest", append(hostSide, controlPlane...), "manifests are verified the same way on both sides"},
		{"./edgeapi", append(hostSide, controlPlane...), "the wire contract is shared"},
		{"./frontdoor", append(append([]string{"net/http", "database/sql"}, hostSide...), controlPlane...),
			"the front-door resolver is pure: both sides run it, no store and no HTTP inside"},
		{"./cmd/cellvisor", controlPlane, "the agent on every edge host carries no control plane or database driver"},
		{"./cmd/cellvisor", packaging, "the agent carries nothing of the package builder"},
		{"./cmd/cellvisor-control", packaging, "the control API carries nothing of the package builder"},
		{"./agent", controlPlane, "the agent carries no control plane"},
		{"./cmd/cellvisor", []string{"cellvisor/internal/fakesystemd"}, "the fake systemd is for tests only"},
		{"./cmd/cellvisor", []string{"cellvisor/testkit"}, "the test kit is for tests and the demo only"},
		{"./cmd/cellvisor-control", []string{"cellvisor/testkit"}, "the test kit is for tests and the demo only"},
		{"./controlclient", append([]string{"cellvisor/runtime", "cellvisor/supervisor", "cellvisor/cgroup", "cellvisor/activation"}, controlPlane...),
			"the control client is the agent's side of the wire only"},
		{"./controlapi/...", []string{"cellvisor/runtime", "cellvisor/supervisor", "cellvisor/cgroup", "cellvisor/activation", "cellvisor/agent"},
			"the control plane links nothing of the edge's runtime"},
		{"./cmd/cellvisor-control", []string{"cellvisor/runtime", "cellvisor/supervisor", "cellvisor/cgroup", "cellvisor/activation", "cellvisor/agent"},
			"the control plane binary links nothing of the edge's runtime"},
	}
	for _, r := range rules {
		t.Run(strings.TrimPrefix(r.pkg, "./"), func(t *testing.T) {
			deps := listDeps(t, r.pkg)
			for _, d := range deps {
				for _, f := range r.forbidden {
					if d == f || strings.HasPrefix(d, f+"/") {
						t.Errorf("%s links %s: %s", r.pkg, d, r.why)
					}
				}
			}
		})
	}
}

// The control API's parts: packages under controlapi/ that the server
// (cellvisor/controlapi itself) wires together. None of them links the
// server; the admin API's wire contract links none of the others either,
// nor a database driver, so that a caller of the admin API links no
// server; the fleet page and the snapshot cache read through what the
// server hands them, never the store.
var controlParts = []string{"adminapi", "fleet", "lease", "metrics", "pki", "snapcache", "store"}

func TestControlAPIParts(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to list dependencies: %v", err)
	}
	const server = module + "controlapi"
	for _, part := range controlParts {
		t.Run(part, func(t *testing.T) {
			for _, d := range listDeps(t, "./controlapi/"+part) {
				if d == server {
					t.Errorf("controlapi/%s links %s: the server wires its parts, never the other way", part, d)
				}
			}
		})
	}
	drivers := []string{"modernc.org/sqlite", "github.com/jackc/pgx/v5"}
	for _, r := range []struct {
		part      string
		noParts   bool // links no other part
		forbidden []string
		why       string
	}{
		{"adminapi", true, drivers, "the admin API's wire contract: the CLI and the demo call it without linking a server part"},
		{"fleet", false, append([]string{server + "/store"}, drivers...), "the fleet page reads through its Reader, never the store"},
		{"snapcache", true, drivers, "the snapshot cache holds files; what they hold is the server's"},
	} {
		self := server + "/" + r.part
		for _, d := range listDeps(t, "./controlapi/"+r.part) {
			if r.noParts && strings.HasPrefix(d, server+"/") && d != self {
				t.Errorf("controlapi/%s links %s: %s", r.part, d, r.why)
			}
			for _, f := range r.forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("controlapi/%s links %s: %s", r.part, d, r.why)
				}
			}
		}
	}
	// The CLI's admin subcommands and the demo call the admin API through
	// adminapi; they link the server only to run it (controlapi.Serve).
	for _, cmd := range []string{"./cmd/cellvisor-control", "./cmd/cellvisor-demo"} {
		for _, imp := range listImports(t, cmd) {
			if imp == server+"/store" {
				t.Errorf("%s imports %s: its wire types and constants are adminapi's", cmd, imp)
			}
		}
	}
}

// TestLeaves: the domain model and placement import no package of this
// module: both sides use them, and placement is pure.
func TestLeaves(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to list dependencies: %v", err)
	}
	for _, leaf := range []string{"domain", "placement"} {
		for _, d := range listDeps(t, "./"+leaf) {
			if strings.HasPrefix(d, module) && d != module+leaf {
				t.Errorf("%s links %s", leaf, d)
			}
		}
	}
}

// listImports returns the packages pattern imports directly (go list,
// without tests).
func listImports(t *testing.T, pattern string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, pattern)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -f {{.Imports}} %s: %v\n%s", pattern, err, stderr.Bytes())
	}
	return strings.Fields(string(out))
}

// listDeps returns every package pattern links, itself included (go list
// -deps, without tests).
func listDeps(t *testing.T, pattern string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", pattern)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pattern, err, stderr.Bytes())
	}
	var deps []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		deps = append(deps, sc.Text())
	}
	if len(deps) == 0 {
		t.Fatalf("go list -deps %s listed nothing", pattern)
	}
	return deps
}
