package frontdoor

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/cases.json from the Go resolver")

// fixturePath is the golden file the Go tests and the cells' Lua tests
// (runtime/frontdoor_lua_test.go) both read.
var fixturePath = filepath.Join("testdata", "cases.json")

// FixtureCase is one pinned decision.
type FixtureCase struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	Rows   []Row  `json:"rows"`
	Edge   string `json:"edge,omitempty"`
	Reason Reason `json:"reason,omitempty"`
	// Canonical is Normalize(URL), or empty when it is malformed.
	Canonical string `json:"canonical,omitempty"`
	// LuaReason, set by hand, is the cells' Lua twin's answer where it
	// knowingly differs: a code point Go refuses from the IDNA tables,
	// which Lua cannot carry, is Punycode-encoded there and answers
	// unmapped (never an edge: no row can hold it). Go must refuse it.
	LuaReason Reason `json:"lua_reason,omitempty"`
}

var (
	shop  = Row{Edge: "edge-a", URL: "https://shop.example.com:443"}
	api   = Row{Edge: "edge-b", URL: "https://api.example.com:8443"}
	plain = Row{Edge: "edge-c", URL: "http://www.example.com:80"}
	idn   = Row{Edge: "edge-d", URL: "https://xn--bcher-kva.example:443"}
	// catalan is a front door whose U-label has a Latin-1 code point the
	// profile allows (U+00B7, the middle dot of "l·l").
	catalan = Row{Edge: "edge-e", URL: "https://xn--collegi-xma.example:443"}
	std     = []Row{shop, api, plain, idn}
)

// fixtureInputs are the cases; -update computes their answers.
var fixtureInputs = []FixtureCase{
	{Name: "exact", URL: "https://shop.example.com", Rows: std},
	{Name: "explicit default port", URL: "https://shop.example.com:443/", Rows: std},
	{Name: "upper-case scheme and host", URL: "HTTPS://SHOP.Example.COM", Rows: std},
	{Name: "trailing dot", URL: "https://shop.example.com.", Rows: std},
	{Name: "trailing dot and port", URL: "https://shop.example.com.:443", Rows: std},
	{Name: "path query fragment dropped", URL: "https://shop.example.com/cart?id=1#top", Rows: std},
	{Name: "non-default port", URL: "https://api.example.com:8443/v1", Rows: std},
	{Name: "wrong port", URL: "https://api.example.com", Rows: std},
	{Name: "wrong scheme", URL: "http://shop.example.com", Rows: std},
	{Name: "http default port", URL: "http://www.example.com/", Rows: std},
	{Name: "http explicit 80", URL: "http://www.example.com:80", Rows: std},
	{Name: "subdomain is not the host", URL: "https://a.shop.example.com", Rows: std},
	{Name: "parent is not the host", URL: "https://example.com", Rows: std},
	{Name: "u-label to a-label", URL: "https://bücher.example", Rows: std},
	{Name: "a-label", URL: "https://xn--bcher-kva.example/", Rows: std},
	{Name: "a-label upper case", URL: "https://XN--BCHER-KVA.EXAMPLE", Rows: std},
	{Name: "u-label mixed ascii case", URL: "https://BÜcher.example", Rows: std},
	{Name: "invalid a-label", URL: "https://xn--a.example", Rows: std},
	{Name: "unmapped", URL: "https://nobody.example.com", Rows: std},
	{Name: "no rows", URL: "https://shop.example.com", Rows: nil},
	{Name: "ambiguous two edges", URL: "https://shop.example.com", Rows: []Row{shop, {Edge: "edge-x", URL: shop.URL}}},
	{Name: "ambiguous same edge twice", URL: "https://shop.example.com", Rows: []Row{shop, shop}},
	{Name: "corrupt row non-canonical url", URL: "https://api.example.com:8443", Rows: []Row{api, {Edge: "edge-a", URL: "https://SHOP.example.com"}}},
	{Name: "corrupt row unparsable url", URL: "https://api.example.com:8443", Rows: []Row{api, {Edge: "edge-a", URL: "ftp://x"}}},
	{Name: "corrupt row empty edge", URL: "https://api.example.com:8443", Rows: []Row{api, {Edge: "", URL: "https://other.example.com:443"}}},
	{Name: "corrupt row bad edge", URL: "https://api.example.com:8443", Rows: []Row{api, {Edge: "edge a", URL: "https://other.example.com:443"}}},
	{Name: "malformed wins over corrupt", URL: "nonsense", Rows: []Row{{Edge: "", URL: ""}}},
	{Name: "no scheme", URL: "shop.example.com", Rows: std},
	{Name: "ftp scheme", URL: "ftp://shop.example.com", Rows: std},
	{Name: "javascript scheme", URL: "javascript://shop.example.com", Rows: std},
	{Name: "empty", URL: "", Rows: std},
	{Name: "userinfo", URL: "https://user@shop.example.com", Rows: std},
	{Name: "userinfo confusion", URL: "https://shop.example.com@evil.example", Rows: std},
	{Name: "empty host", URL: "https:///path", Rows: std},
	{Name: "only a dot", URL: "https://.", Rows: std},
	{Name: "two trailing dots", URL: "https://shop.example.com..", Rows: std},
	{Name: "empty label", URL: "https://shop..example.com", Rows: std},
	{Name: "leading dot", URL: "https://.shop.example.com", Rows: std},
	{Name: "port zero", URL: "https://shop.example.com:0", Rows: std},
	{Name: "port too big", URL: "https://shop.example.com:65536", Rows: std},
	{Name: "port signed", URL: "https://shop.example.com:+443", Rows: std},
	{Name: "port empty", URL: "https://shop.example.com:", Rows: std},
	{Name: "port leading zeros read as decimal", URL: "https://shop.example.com:0443", Rows: std},
	{Name: "ipv4 literal", URL: "https://127.0.0.1", Rows: std},
	{Name: "ipv6 literal", URL: "https://[::1]:443", Rows: std},
	{Name: "integer host", URL: "https://2130706433", Rows: std},
	{Name: "space in host", URL: "https://shop example.com", Rows: std},
	{Name: "tab", URL: "https://shop.example.com\t", Rows: std},
	{Name: "backslash", URL: "https://shop.example.com\\@evil.example", Rows: std},
	{Name: "percent-encoded host", URL: "https://shop%2eexample.com", Rows: std},
	{Name: "underscore", URL: "https://shop_1.example.com", Rows: std},
	{Name: "hyphen at label start", URL: "https://-shop.example.com", Rows: std},
	{Name: "hyphen at label end", URL: "https://shop-.example.com", Rows: std},
	{Name: "label of 64", URL: "https://" + repeat('a', 64) + ".example.com", Rows: std},
	{Name: "label of 63", URL: "https://" + repeat('a', 63) + ".example.com", Rows: std},
	{Name: "replacement character", URL: "https://shop\ufffd.example.com", Rows: std},
	{Name: "ascii upper case in a u-label", URL: "https://Bücher.example", Rows: std},
	{Name: "symbol the profile allows", URL: "https://☃.example", Rows: std},
	{Name: "hyphens in 3rd and 4th position", URL: "https://ab--cd.example.com", Rows: std},
	{Name: "a-label that is all ascii", URL: "https://xn--abc-.example.com", Rows: std},
	{Name: "greek u-label", URL: "https://ελ.example", Rows: std},
	{Name: "c1 control u-label", URL: "https://a\u0085b.example", Rows: std},
	{Name: "latin-1 upper case", URL: "https://Éclair.example", Rows: std},
	{Name: "latin-1 middle dot resolves", URL: "https://col·legi.example/", Rows: append(append([]Row(nil), std...), catalan)},
	{Name: "latin-1 middle dot a-label resolves", URL: "https://xn--collegi-xma.example", Rows: append(append([]Row(nil), std...), catalan)},
	{Name: "latin-1 symbol the profile allows", URL: "https://a£b.example", Rows: std},
	{Name: "latin-1 inverted question mark the profile allows", URL: "https://¿a.example", Rows: std},
	{Name: "multiplication sign the profile allows", URL: "https://a×b.example", Rows: std},
	{Name: "division sign the profile allows", URL: "https://a÷b.example", Rows: std},
	{Name: "no-break space", URL: "https://a\u00a0b.example", Rows: std},
	{Name: "soft hyphen", URL: "https://shop\u00adexample.com", Rows: std},
	{Name: "feminine ordinal", URL: "https://aªb.example", Rows: std},
	{Name: "superscript two", URL: "https://a²b.example", Rows: std},
	{Name: "micro sign", URL: "https://aµb.example", Rows: std},
	{Name: "vulgar fraction", URL: "https://a½b.example", Rows: std},
	{Name: "latin-1 upper case o with stroke", URL: "https://Øl.example", Rows: std},
	{Name: "fullwidth full stop", URL: "https://shop\uff0eexample\uff0ecom", Rows: std, LuaReason: Unmapped},
	{Name: "ideographic full stop", URL: "https://shop\u3002example\u3002com", Rows: std, LuaReason: Unmapped},
	{Name: "zero width joiner", URL: "https://sh\u200dop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "zero width non-joiner", URL: "https://sh\u200cop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "byte order mark", URL: "https://\ufeffshop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "leading combining mark", URL: "https://\u0301shop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "not in NFC", URL: "https://bu\u0308cher.example", Rows: std, LuaReason: Unmapped},
	{Name: "greek upper case", URL: "https://\u03a3hop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "kelvin sign", URL: "https://\u212aey.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "capital sharp s", URL: "https://\u1e9ehop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "long s", URL: "https://\u017fhop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "dotted capital i", URL: "https://\u0130shop.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "bidi: hebrew and latin in one label", URL: "https://a\u05d0.example.com", Rows: std, LuaReason: Unmapped},
	{Name: "emoji the profile allows", URL: "https://\U0001f600.example.com", Rows: std},
	{Name: "too long", URL: "https://shop.example.com/" + repeat('x', MaxURLLen), Rows: std},
}

// Every Latin-1 code point inside a U-label, one case each: the Lua twin
// names exactly the ones Go's profile refuses.
func init() {
	for cp := rune(0x80); cp <= 0xff; cp++ {
		fixtureInputs = append(fixtureInputs, FixtureCase{Name: fmt.Sprintf("latin-1 U+%04X in a u-label", cp), URL: "https://a" + string(cp) + "b.example", Rows: std})
	}
}

func repeat(c byte, n int) string { return string(bytes.Repeat([]byte{c}, n)) }

func decide(c FixtureCase) FixtureCase {
	edge, err := Resolve(c.URL, c.Rows)
	c.Edge, c.Reason, c.Canonical = edge, "", ""
	if err != nil {
		reason, ok := IsRefusal(err)
		if !ok {
			panic("resolve returned a non-refusal error: " + err.Error())
		}
		c.Reason = reason
	}
	if n, err := Normalize(c.URL); err == nil {
		c.Canonical = n
	}
	return c
}

func TestFixture(t *testing.T) {
	if *update {
		var out []FixtureCase
		for _, c := range fixtureInputs {
			out = append(out, decide(c))
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fixturePath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := readFixture(t)
	if len(cases) != len(fixtureInputs) {
		t.Fatalf("%s has %d cases, the Go list %d: run go test ./frontdoor -run TestFixture -update", fixturePath, len(cases), len(fixtureInputs))
	}
	seen := map[Reason]int{}
	for i, c := range cases {
		if c.Name != fixtureInputs[i].Name || c.URL != fixtureInputs[i].URL {
			t.Errorf("case %d is %q in the file, %q in the Go list: run -update", i, c.Name, fixtureInputs[i].Name)
		}
		got := decide(c)
		if got.Edge != c.Edge || got.Reason != c.Reason || got.Canonical != c.Canonical {
			t.Errorf("%s: resolve(%q) = edge %q reason %q canonical %q, fixture says edge %q reason %q canonical %q",
				c.Name, c.URL, got.Edge, got.Reason, got.Canonical, c.Edge, c.Reason, c.Canonical)
		}
		if c.Edge == "" && c.Reason == "" {
			t.Errorf("%s: neither an edge nor a reason", c.Name)
		}
		if c.LuaReason != fixtureInputs[i].LuaReason {
			t.Errorf("%s: lua_reason %q in the file, %q in the Go list: run -update", c.Name, c.LuaReason, fixtureInputs[i].LuaReason)
		}
		if c.LuaReason != "" && (c.Reason != Malformed || c.LuaReason == Malformed) {
			t.Errorf("%s: Go answers %q, Lua %q: a known difference is only Go refusing malformed what Lua refuses otherwise", c.Name, c.Reason, c.LuaReason)
		}
		seen[c.Reason]++
	}
	for _, r := range []Reason{"", Unmapped, Ambiguous, CorruptRow, Malformed} {
		if seen[r] == 0 {
			t.Errorf("the fixture has no case answering %q", r)
		}
	}
}

func readFixture(t *testing.T) []FixtureCase {
	t.Helper()
	b, err := os.ReadFile(fixturePath)
	if err != nil {
		t.Fatal(err)
	}
	var cases []FixtureCase
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cases); err != nil {
		t.Fatalf("decode %s: %v", fixturePath, err)
	}
	return cases
}

// FuzzResolve checks that Resolve never panics, that a refusal is always a
// *Refusal, that it resolves only inputs that normalize, and that an
// answer is the edge of the one row holding the input's canonical origin.
func FuzzResolve(f *testing.F) {
	for _, c := range fixtureInputs {
		f.Add(c.URL)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		rows := append([]Row(nil), std...)
		if n, err := Normalize(raw); err == nil {
			if n2, err := Normalize(n); err != nil || n2 != n {
				t.Fatalf("normalize is not idempotent: %q -> %q -> %q (%v)", raw, n, n2, err)
			}
			rows = append(rows, Row{Edge: "edge-fuzz", URL: n})
		}
		edge, err := Resolve(raw, rows)
		if err != nil {
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("resolve(%q): %v is not a refusal", raw, err)
			}
			return
		}
		n, nerr := Normalize(raw)
		if nerr != nil {
			t.Fatalf("resolve(%q) = %q but the input is malformed: %v", raw, edge, nerr)
		}
		matches := 0
		for _, r := range rows {
			if r.URL == n {
				matches++
				if r.Edge != edge {
					t.Fatalf("resolve(%q) = %q, row holds %q", raw, edge, r.Edge)
				}
			}
		}
		if matches != 1 {
			t.Fatalf("resolve(%q) = %q with %d matching rows", raw, edge, matches)
		}
	})
}
