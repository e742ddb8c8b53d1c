// Package deptest keeps the project's layering true: it lists what each
// package links (go list -deps) and fails when a dependency runs the wrong
// way: the edge agent linking the control plane or a database driver, the
// control plane linking the edge's runtime, or the shared models reaching
// into the host. It has tests only.
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
	"cellvisor/runtime", "cellvisor/supervisor", "cellvisor/cgroup", "cellvisor/activation",
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
