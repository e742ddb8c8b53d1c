package deptest

import (
	"fmt"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// A claim is a sentence of a package comment that says who imports the
// package. Three forms are read:
//
//   - "[Only] A, B and C import it" (or imports, use, uses, run, runs):
//     the packages named must be exactly the package's importers (not
//     counting tests). An item is a module-relative package path,
//     "tests" or "its tests" (not counted), or a phrase followed by the
//     paths it means in parentheses: "the control API's listeners
//     (controlapi, controlapi/metrics)".
//   - "Only tests import it", "Nothing outside tests imports it": no
//     package imports it but tests.
//   - "Any package may import it": a permission; the table must agree
//     (no only list).
//
// A clause whose subject is not such a list ("both sides import it") is
// prose, not a claim. Every package that can be imported needs at least
// one claim.
type claim struct {
	text  string
	kind  claimKind
	names []string // for named: the packages named, sorted
}

type claimKind int

const (
	named claimKind = iota
	testsOnly
	anyPackage
)

var (
	clauseSep  = regexp.MustCompile(`[.;:]\s+`)
	claimRE    = regexp.MustCompile(`^(?:[Oo]nly )?(.+?) (?:import|imports|use|uses|run|runs) it\b`)
	testsRE    = regexp.MustCompile(`^(?i)(?:only tests import it|nothing outside tests imports it)\b`)
	anyRE      = regexp.MustCompile(`^(?i)any package may import it\b`)
	parensItem = regexp.MustCompile(`^[^()]*\S \((.+)\)$`)
)

// readClaims returns the claims of a package comment; isPkg tells a
// module-relative package path.
func readClaims(doc string, isPkg func(string) bool) []claim {
	text := strings.Join(strings.Fields(doc), " ")
	var claims []claim
	for _, c := range clauseSep.Split(text, -1) {
		c = strings.TrimSuffix(c, ".")
		switch {
		case testsRE.MatchString(c):
			claims = append(claims, claim{text: c, kind: testsOnly})
		case anyRE.MatchString(c):
			claims = append(claims, claim{text: c, kind: anyPackage})
		default:
			m := claimRE.FindStringSubmatch(c)
			if m == nil {
				continue
			}
			if names, ok := readList(m[1], isPkg); ok && len(names) > 0 {
				sort.Strings(names)
				claims = append(claims, claim{text: c, kind: named, names: slices.Compact(names)})
			}
		}
	}
	return claims
}

// readList reads "A, B and C", each item a package, "tests", or a phrase
// with packages in parentheses; ok is false if an item is none of these.
func readList(s string, isPkg func(string) bool) (names []string, ok bool) {
	for _, item := range splitList(s) {
		switch m := parensItem.FindStringSubmatch(item); {
		case isPkg(item):
			names = append(names, item)
		case strings.EqualFold(item, "tests") || strings.EqualFold(item, "its tests"):
		case m != nil:
			for _, inner := range splitList(m[1]) {
				if !isPkg(inner) {
					return nil, false
				}
				names = append(names, inner)
			}
		default:
			return nil, false
		}
	}
	return names, true
}

// splitList splits s at ", ", " and " and ", and " outside parentheses.
func splitList(s string) []string {
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		}
		if depth != 0 {
			continue
		}
		for _, sep := range []string{", and ", ", ", " and "} {
			if strings.HasPrefix(s[i:], sep) {
				items = append(items, strings.TrimSpace(s[start:i]))
				i += len(sep) - 1
				start = i + 1
				break
			}
		}
	}
	return append(items, strings.TrimSpace(s[start:]))
}

// packageDoc returns the package comment of p's non-test files.
func packageDoc(t *testing.T, p pkg) string {
	t.Helper()
	fset := token.NewFileSet()
	var docs []string
	for _, name := range p.files {
		f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatalf("%s: %v", p.path, err)
		}
		if f.Doc != nil {
			docs = append(docs, f.Doc.Text())
		}
	}
	return strings.Join(docs, "\n")
}

// checkClaims holds a package's claims against its actual importers
// (sorted) and its row.
func checkClaims(path string, claims []claim, importers []string, r row) []string {
	if len(claims) == 0 {
		hint := "Only tests import it"
		if len(importers) > 0 {
			verb := " import it"
			if len(importers) == 1 {
				verb = " imports it"
			}
			hint = "Only " + strings.Join(importers, ", ") + verb
		}
		return []string{fmt.Sprintf("%s: its package comment says nothing of who imports it: add a sentence such as %q", path, hint)}
	}
	var errs []string
	for _, c := range claims {
		switch c.kind {
		case testsOnly:
			if len(importers) > 0 {
				errs = append(errs, fmt.Sprintf("%s: %q, but %s import it", path, c.text, strings.Join(importers, ", ")))
			}
		case anyPackage:
			if r.only != nil || r.tests {
				errs = append(errs, fmt.Sprintf("%s: %q, but its row in the table lets only %s", path, c.text, orNone(r.only)))
			}
		case named:
			if !slices.Equal(c.names, importers) {
				errs = append(errs, fmt.Sprintf("%s: %q: not named: %s; named but not importing it: %s",
					path, c.text, orNone(minus(importers, c.names)), orNone(minus(c.names, importers))))
			}
		}
	}
	return errs
}

func minus(a, b []string) []string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, x)
		}
	}
	return d
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// TestPackageDocs: every package that can be imported says who imports
// it, and says it truly.
func TestPackageDocs(t *testing.T) {
	pkgs := listModule(t)
	importers := map[string][]string{}
	for _, p := range pkgs {
		for _, imp := range p.imports {
			importers[imp] = append(importers[imp], p.path)
		}
	}
	isPkg := func(s string) bool { _, ok := pkgs[s]; return ok }
	for path, p := range pkgs {
		if p.name == "main" || len(p.files) == 0 {
			continue // a command, or tests only: nothing imports it
		}
		imps := importers[path]
		sort.Strings(imps)
		for _, e := range checkClaims(path, readClaims(packageDoc(t, p), isPkg), imps, table[path]) {
			t.Error(e)
		}
	}
}

// TestReadClaims: the forms of a claim, and prose that is none.
func TestReadClaims(t *testing.T) {
	pkgs := []string{"agent", "supervisor", "controlapi", "controlapi/lease", "controlapi/metrics", "cmd/cellvisor"}
	isPkg := func(s string) bool { return slices.Contains(pkgs, s) }
	for _, tc := range []struct {
		name string
		doc  string
		want []claim
	}{
		{"only", "Package x does y. Only supervisor and cmd/cellvisor import it.",
			[]claim{{"Only supervisor and cmd/cellvisor import it", named, []string{"cmd/cellvisor", "supervisor"}}}},
		{"list with tests", "Package x. Only supervisor (and tests) import it.", nil},
		{"its tests", "Package x. Only agent and its tests import it: nothing else.",
			[]claim{{"Only agent and its tests import it", named, []string{"agent"}}}},
		{"parenthesized", "Package x. The control plane's store (controlapi, controlapi/lease) and\nthe metrics (controlapi/metrics) use it.",
			[]claim{{"The control plane's store (controlapi, controlapi/lease) and the metrics (controlapi/metrics) use it", named,
				[]string{"controlapi", "controlapi/lease", "controlapi/metrics"}}}},
		{"after a semicolon", "Package x. controlapi serves it; only controlapi imports it.",
			[]claim{{"only controlapi imports it", named, []string{"controlapi"}}}},
		{"run", "Package x. cmd/cellvisor runs it; the demo runs that binary.",
			[]claim{{"cmd/cellvisor runs it", named, []string{"cmd/cellvisor"}}}},
		{"tests only", "Package x is for tests. Nothing outside tests imports it.",
			[]claim{{"Nothing outside tests imports it", testsOnly, nil}}},
		{"any", "Package x. Any package may import it.", []claim{{"Any package may import it", anyPackage, nil}}},
		{"prose", "Package x. It imports nothing of the edge (agent, supervisor), and both sides import it. The agent's writers use it.", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := readClaims(tc.doc, isPkg)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("readClaims(%q)\n got %v\nwant %v", tc.doc, got, tc.want)
			}
		})
	}
}

// TestCheckClaims: a false claim, a missing one and a permission the
// table does not give are reported.
func TestCheckClaims(t *testing.T) {
	only := claim{"Only supervisor and cmd/cellvisor import it", named, []string{"cmd/cellvisor", "supervisor"}}
	for _, tc := range []struct {
		name      string
		claims    []claim
		importers []string
		r         row
		want      []string
	}{
		{"true", []claim{only}, []string{"cmd/cellvisor", "supervisor"}, row{}, nil},
		{"false", []claim{only}, []string{"agent", "supervisor"}, row{},
			[]string{`cgroup: "Only supervisor and cmd/cellvisor import it": not named: agent; named but not importing it: cmd/cellvisor`}},
		{"missing", nil, []string{"agent"}, row{},
			[]string{`cgroup: its package comment says nothing of who imports it: add a sentence such as "Only agent imports it"`}},
		{"tests only", []claim{{"Only tests import it", testsOnly, nil}}, []string{"agent"}, row{},
			[]string{`cgroup: "Only tests import it", but agent import it`}},
		{"any, restricted", []claim{{"Any package may import it", anyPackage, nil}}, []string{"agent"}, row{only: []string{"agent"}},
			[]string{`cgroup: "Any package may import it", but its row in the table lets only agent`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := checkClaims("cgroup", tc.claims, tc.importers, tc.r); !slices.Equal(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}
