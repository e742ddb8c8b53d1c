package deptest

import (
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A pkg is one package of the module as go list sees it, by path
// relative to the module.
type pkg struct {
	path    string
	name    string   // package name: main for a command
	dir     string   // absolute directory
	files   []string // non-test Go files of this build
	imports []string // the module's packages its non-test code imports
	tests   []string // the module's packages its tests import (itself left out)
}

// graph maps a package (module-relative path) to the module's packages it
// imports.
type graph map[string][]string

// listModule lists every package of the module with go list.
func listModule(t *testing.T) map[string]pkg {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to list packages: %v", err)
	}
	const sep = "\x1f"
	format := strings.Join([]string{"{{.ImportPath}}", "{{.Name}}", "{{.Dir}}", `{{join .GoFiles " "}}`,
		`{{join .Imports " "}}`, `{{join .TestImports " "}} {{join .XTestImports " "}}`}, sep)
	cmd := exec.Command("go", "list", "-f", format, "./...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v\n%s", err, stderr.Bytes())
	}
	pkgs := map[string]pkg{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, sep)
		if len(f) != 6 {
			t.Fatalf("go list: cannot read %q", line)
		}
		p := pkg{path: strings.TrimPrefix(f[0], module), name: f[1], dir: f[2], files: strings.Fields(f[3])}
		p.imports = ours(strings.Fields(f[4]), p.path)
		p.tests = ours(strings.Fields(f[5]), p.path)
		pkgs[p.path] = p
	}
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed nothing")
	}
	return pkgs
}

// ours keeps the module's packages of imports, relative, sorted, without
// self and duplicates.
func ours(imports []string, self string) []string {
	var rel []string
	for _, imp := range imports {
		if r, ok := strings.CutPrefix(imp, module); ok && r != self && !slices.Contains(rel, r) {
			rel = append(rel, r)
		}
	}
	sort.Strings(rel)
	return rel
}

// graphs splits the listing into the non-test import graph and the
// tests' one.
func graphs(pkgs map[string]pkg) (code, tests graph) {
	code, tests = graph{}, graph{}
	for path, p := range pkgs {
		code[path], tests[path] = p.imports, p.tests
	}
	return code, tests
}

func edge(from, to string) string { return from + " -> " + to }

// check holds the non-test import graph g against the table: every
// package of g has a row and every row a package; every import is one the
// imported package's row allows (its only list, or else its floor); and
// an import that runs back up the floors is one of backUp, each of which
// still occurs. It returns one line per violation, sorted.
func check(tab map[string]row, g graph, backUp map[string]string) []string {
	var errs []string
	for path := range g {
		if _, ok := tab[path]; !ok {
			errs = append(errs, fmt.Sprintf("%s: not in the table: give it a row (its floor and who may import it)", path))
		}
	}
	for path := range tab {
		if _, ok := g[path]; !ok {
			errs = append(errs, fmt.Sprintf("%s: in the table but not in the module: remove its row", path))
		}
	}
	seen := map[string]bool{}
	for from, imports := range g {
		fr, fok := tab[from]
		for _, to := range imports {
			tr, tok := tab[to]
			if !fok || !tok {
				continue // reported above
			}
			e := edge(from, to)
			switch {
			case tr.tests:
				errs = append(errs, fmt.Sprintf("%s: only tests may import %s", e, to))
			case tr.only != nil && !slices.Contains(tr.only, from):
				errs = append(errs, fmt.Sprintf("%s: only %s may import %s", e, strings.Join(tr.only, ", "), to))
			case slices.Contains(mayImport[fr.tier], tr.tier):
			default:
				if _, ok := backUp[e]; ok {
					seen[e] = true
				} else {
					errs = append(errs, fmt.Sprintf("%s: the floors forbid it: %s (%s) may import only from %s", e, from, fr.tier, tierList(fr.tier)))
				}
			}
		}
	}
	errs = append(errs, stale(backUp, seen, "backUp")...)
	sort.Strings(errs)
	return errs
}

// checkTests holds the tests' import graph g to the floors alone: a test
// may import what its package's floor may import, any harness, and what
// its package's own code imports (code, which check holds); the rows'
// only lists bind non-test code only. Imports that run back up are those
// of known, each of which still occurs.
func checkTests(tab map[string]row, g, code graph, known map[string]string) []string {
	var errs []string
	seen := map[string]bool{}
	for from, imports := range g {
		fr, fok := tab[from]
		for _, to := range imports {
			tr, tok := tab[to]
			if !fok || !tok || tr.tests || slices.Contains(mayImport[fr.tier], tr.tier) || slices.Contains(code[from], to) {
				continue // a missing row is check's to report
			}
			e := edge(from, to)
			if _, ok := known[e]; !ok {
				errs = append(errs, fmt.Sprintf("%s (tests): the floors forbid it: from %s to %s", e, fr.tier, tr.tier))
			}
			seen[e] = true
		}
	}
	errs = append(errs, stale(known, seen, "testBackUp")...)
	sort.Strings(errs)
	return errs
}

// stale reports the entries of known that no longer occur.
func stale(known map[string]string, seen map[string]bool, name string) []string {
	var errs []string
	for e := range known {
		if !seen[e] {
			errs = append(errs, fmt.Sprintf("%s: listed in %s but no longer runs back up: remove it", e, name))
		}
	}
	return errs
}

func tierList(t tier) string {
	var s []string
	for _, u := range mayImport[t] {
		s = append(s, u.String())
	}
	return strings.Join(s, ", ")
}

// TestTable: every package of the module has a row, and every import of
// the module's packages is one the table allows.
func TestTable(t *testing.T) {
	code, tests := graphs(listModule(t))
	for _, e := range check(table, code, backUp) {
		t.Error(e)
	}
	for _, e := range checkTests(table, tests, code, testBackUp) {
		t.Error(e)
	}
}

// TestTableRows: the rows themselves are well formed: every package an
// only list names exists, and may import the row's package by its floor
// or is a known back-up import.
func TestTableRows(t *testing.T) {
	for path, r := range table {
		if r.tests && r.only != nil {
			t.Errorf("%s: a row for tests only lists importers", path)
		}
		for _, from := range r.only {
			fr, ok := table[from]
			if !ok {
				t.Errorf("%s: only names %s, which has no row", path, from)
				continue
			}
			if _, known := backUp[edge(from, path)]; !known && !slices.Contains(mayImport[fr.tier], r.tier) {
				t.Errorf("%s: only names %s, whose floor (%s) may not import %s's (%s)", path, from, fr.tier, path, r.tier)
			}
		}
	}
}

// TestCheck: check reports what it should on a made-up module.
func TestCheck(t *testing.T) {
	tab := map[string]row{
		"internal/util":  {tier: util},
		"internal/harn":  {tier: util, tests: true},
		"internal/spawn": {tier: util},
		"domain":         {tier: model},
		"cgroup":         {tier: host, only: []string{"supervisor", "internal/spawn"}},
		"supervisor":     {tier: cells},
		"controlapi":     {tier: control},
		"gone":           {tier: util},
	}
	g := graph{
		"internal/util":  nil,
		"internal/harn":  nil,
		"internal/spawn": {"cgroup"},                         // back up, but known
		"domain":         {"internal/util"},                  // down: fine
		"cgroup":         {"domain", "internal/util"},        // down: fine
		"supervisor":     {"cgroup", "internal/harn"},        // harness outside tests
		"controlapi":     {"domain", "cgroup", "supervisor"}, // not in cgroup's only; control may not import cells
		"agentmetrics":   {"supervisor"},                     // a package with no row
	}
	known := map[string]string{
		"internal/spawn -> cgroup": "known",
		"internal/util -> domain":  "no longer occurs",
	}
	want := []string{
		"agentmetrics: not in the table: give it a row (its floor and who may import it)",
		"controlapi -> cgroup: only supervisor, internal/spawn may import cgroup",
		"controlapi -> supervisor: the floors forbid it: controlapi (control) may import only from util, model, control",
		"gone: in the table but not in the module: remove its row",
		"internal/util -> domain: listed in backUp but no longer runs back up: remove it",
		"supervisor -> internal/harn: only tests may import internal/harn",
	}
	if got := check(tab, g, known); !slices.Equal(got, want) {
		t.Errorf("check:\n got %q\nwant %q", got, want)
	}
	// An unknown back-up import is reported even when the row allows it.
	delete(known, "internal/spawn -> cgroup")
	got := check(tab, graph{"internal/spawn": {"cgroup"}, "cgroup": nil, "supervisor": nil}, known)
	if !slices.Contains(got, "internal/spawn -> cgroup: the floors forbid it: internal/spawn (util) may import only from util") {
		t.Errorf("check did not report an unknown back-up import: %q", got)
	}

	// Tests: held to the floors; harnesses and the only lists do not bind them.
	tg := graph{
		"internal/util":  {"internal/harn"},        // a harness: fine
		"internal/spawn": {"cgroup"},               // what its code imports: check's
		"domain":         {"cgroup"},               // back up, unknown
		"controlapi":     {"cgroup", "supervisor"}, // cgroup back up but known; supervisor unknown
	}
	tknown := map[string]string{"controlapi -> cgroup": "known", "cgroup -> supervisor": "gone"}
	twant := []string{
		"cgroup -> supervisor: listed in testBackUp but no longer runs back up: remove it",
		"controlapi -> supervisor (tests): the floors forbid it: from control to cells",
		"domain -> cgroup (tests): the floors forbid it: from model to host",
	}
	if got := checkTests(tab, tg, graph{"internal/spawn": {"cgroup"}}, tknown); !slices.Equal(got, twant) {
		t.Errorf("checkTests:\n got %q\nwant %q", got, twant)
	}
}
