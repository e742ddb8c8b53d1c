package runtime

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"cellvisor/domain"
)

const goodDomain = `{"domain":"shop.example.com","pool":"shared-default","revision":3,
 "hostnames":["shop.example.com","*.shop.example.com"],
 "origins":[{"name":"app","url":"http://127.0.0.1:9000"}],
 "routes":[{"prefix":"/","origin":"app"},{"prefix":"/health","respond":{"status":200,"body":"ok"}}],
 "cache":{"ttl_seconds":60}}`

func TestDomainsDirRefusesTwoDomainsForOneHostname(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.json"), []byte(goodDomain), 0o644)
	other := strings.Replace(goodDomain, `"domain":"shop.example.com"`, `"domain":"other.example.com"`, 1)
	os.WriteFile(filepath.Join(dir, "b.json"), []byte(other), 0o644)
	if _, err := LoadDomainsDir(dir); err == nil || !strings.Contains(err.Error(), "claimed by") {
		t.Fatalf("err %v, want a hostname claimed twice", err)
	}
}

func FuzzDecodeDomain(f *testing.F) {
	f.Add([]byte(goodDomain))
	f.Add([]byte(`{"domain":"a.b","pool":"shared-x","revision":1,"hostnames":["a.b"],"routes":[{"prefix":"/","respond":{"status":200,"body":""}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := domain.Decode(data)
		if err != nil {
			return
		}
		// Whatever decodes must be valid and compile.
		if err := d.Validate(); err != nil {
			t.Fatalf("decoded but invalid: %v", err)
		}
		if _, err := CompilePools([]domain.Domain{d}); err != nil {
			t.Fatalf("decoded but does not compile: %v", err)
		}
	})
}

// What the cells run is what was validated: a second key differing only in
// case (Go's decoder takes the last, matching case-insensitively; the cells'
// Lua reads exact keys) cannot smuggle unvalidated routes to the cell.
func TestPoolJSONIsTheValidatedDomain(t *testing.T) {
	doc := `{"domain":"a.test","pool":"shared-default","revision":1,"hostnames":["a.test"],
	 "routes":[{"prefix":"no-slash","respond":{"status":999,"body":"smuggled"}}],
	 "Routes":[{"prefix":"/","respond":{"status":200,"body":"validated"}}]}`
	d, err := domain.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	pools, err := CompilePools([]domain.Domain{d})
	if err != nil {
		t.Fatal(err)
	}
	out, err := pools[domain.PoolSharedDefault].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "smuggled") || !strings.Contains(string(out), `"routes":[{"prefix":"/"`) {
		t.Errorf("pool JSON carries what was not validated:\n%s", out)
	}
}

// A domain restricted to cells is served by exactly those cells, of any
// pool; each slot keeps its own pool; unrestricted domains go to every cell
// of their pool; equal selections share one runtime.
func TestCompileSlotsCellsSpanPools(t *testing.T) {
	mk := func(name, pool string) domain.Domain {
		return domain.Domain{Domain: name, Pool: pool, Revision: 1, Hostnames: []string{name}}
	}
	pools, err := CompilePools([]domain.Domain{mk("m.test", "shared-default"), mk("s.test", "shared-default"), mk("r.test", "reserved-eu")})
	if err != nil {
		t.Fatal(err)
	}
	assign := Assignments{"cell-01": "shared-default", "cell-02": "shared-default", "cell-03": "reserved-eu", "cell-04": "reserved-eu", "cell-05": "reserved-x"}
	slots := CompileSlots(pools, assign, map[string][]string{"m.test": {"cell-01", "cell-03", "cell-05", "cell-07"}})
	want := map[string][]string{
		"cell-01": {"m.test", "s.test"},
		"cell-02": {"s.test"},
		"cell-03": {"m.test", "r.test"},
		"cell-04": {"r.test"},
		"cell-05": {"m.test"},
	}
	for slot, hosts := range want {
		p := slots[slot]
		if p == nil || p.Pool != assign[slot] {
			t.Fatalf("%s: runtime %+v, want pool %s", slot, p, assign[slot])
		}
		var got []string
		for h := range p.Hosts {
			got = append(got, h)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(hosts, ",") {
			t.Errorf("%s serves %v, want %v", slot, got, hosts)
		}
	}
	if len(slots) != len(assign) {
		t.Errorf("%d slots compiled, want %d (cell-07 is unassigned)", len(slots), len(assign))
	}
}
