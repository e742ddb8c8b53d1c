package manifest

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
)

func namedKey(name string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte(name))
	return ed25519.NewKeyFromSeed(seed[:])
}

func pubOf(priv ed25519.PrivateKey) ed25519.PublicKey { return priv.Public().(ed25519.PublicKey) }

func TestVerifyHeader(t *testing.T) {
	pub, priv := key(t)
	other := namedKey("other")
	good := manifestOf(t, priv, 5, 3)
	if signer, err := good.VerifyHeader(pub, edge); err != nil || !signer.Equal(pub) {
		t.Fatalf("good manifest: signer %x, %v", signer, err)
	}
	empty := Sign(priv, Manifest{EdgeID: edge, Sequence: 6}, nil)
	if _, err := empty.VerifyHeader(pub, edge); err != nil {
		t.Fatalf("signed empty manifest: %v", err)
	}
	older := manifestOf(t, priv, 4, 3)

	mutate := func(f func(m *Manifest)) Manifest {
		m := good
		m.Entries = slices.Clone(good.Entries)
		m.Header.Rotations = slices.Clone(good.Header.Rotations)
		f(&m)
		return m
	}
	tests := []struct {
		name string
		m    Manifest
		edge string
	}{
		{"no header", mutate(func(m *Manifest) { m.Header, m.HeaderSignature = Header{}, "" }), edge},
		{"empty manifest, unsigned", Manifest{EdgeID: edge, Sequence: 6}, edge},
		{"empty manifest, forged", Sign(other, Manifest{EdgeID: edge, Sequence: 6}, nil), edge},
		{"signed by another key", Sign(other, good, nil), edge},
		{"an entry dropped", mutate(func(m *Manifest) { m.Entries = m.Entries[1:] }), edge},
		{"every entry dropped", mutate(func(m *Manifest) { m.Entries = nil }), edge},
		{"an entry swapped for another revision", mutate(func(m *Manifest) {
			m.Entries[0] = NewEntry(priv, edge, m.Entries[0].Domain, "shared-default", 9, artifact(m.Entries[0].Domain))
		}), edge},
		{"rollback flag set after signing", mutate(func(m *Manifest) { m.Entries[0].Rollback = true }), edge},
		{"old entries under a new sequence", mutate(func(m *Manifest) { m.Sequence = 6 }), edge},
		{"old header replayed under a new sequence", mutate(func(m *Manifest) {
			m.Header, m.HeaderSignature = older.Header, older.HeaderSignature
		}), edge},
		{"header edited after signing", mutate(func(m *Manifest) { m.Header.Sequence = 6; m.Sequence = 6 }), edge},
		{"another edge's", good, "another-edge"},
		{"assignments digest forged", mutate(func(m *Manifest) { m.Header.AssignmentsDigest = good.Header.EntriesDigest }), edge},
		{"sequence over 2^53-1", Sign(priv, Manifest{EdgeID: edge, Sequence: math.MaxInt64}, nil), edge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.m.VerifyHeader(pub, tc.edge); !errors.Is(err, ErrHeader) || !IsRefusal(err) {
				t.Errorf("err %v, want ErrHeader", err)
			}
		})
	}
}

func TestEntriesDigestIsCanonical(t *testing.T) {
	_, priv := key(t)
	m := manifestOf(t, priv, 2, 4)
	reversed := slices.Clone(m.Entries)
	slices.Reverse(reversed)
	if EntriesDigest(edge, reversed) != EntriesDigest(edge, m.Entries) {
		t.Error("the digest depends on the order entries arrive in")
	}
	if EntriesDigest(edge, m.Entries) == EntriesDigest("another-edge", m.Entries) {
		t.Error("the digest does not bind the edge")
	}
	rb := slices.Clone(m.Entries)
	rb[0].Rollback = true
	if EntriesDigest(edge, rb) == EntriesDigest(edge, m.Entries) {
		t.Error("the digest does not cover the rollback flag")
	}
	e := m.Entries[0]
	h := Header{EdgeID: edge, Sequence: 1, Entries: 1, EntriesDigest: EntriesDigest(edge, []Entry{e})}
	if string(h.SigningMessage()[:len(headerDomain)]) == string(SigningMessage(edge, e)[:len(signingDomain)]) {
		t.Error("header and entry messages share a prefix")
	}
}

func TestKeyRotationChain(t *testing.T) {
	k0, k1, k2 := namedKey("k0"), namedKey("k1"), namedKey("k2")
	r01, r12 := NewRotation(k0, k1), NewRotation(k1, k2)
	base := manifestOf(t, k2, 7, 2) // entries signed by k2; the header is what matters here
	chain := Sign(k2, base, []Rotation{r01, r12})

	for _, pinned := range []ed25519.PrivateKey{k0, k1, k2} {
		signer, err := chain.VerifyHeader(pubOf(pinned), edge)
		if err != nil || !signer.Equal(pubOf(k2)) {
			t.Errorf("pinned %x: signer %x, %v; want k2", pubOf(pinned)[:4], signer, err)
		}
	}
	// After pinning k2, a manifest signed by an older key is refused, even
	// with the chain that led from it.
	for _, old := range []ed25519.PrivateKey{k0, k1} {
		m := Sign(old, base, []Rotation{r01, r12})
		if _, err := m.VerifyHeader(pubOf(k2), edge); !errors.Is(err, ErrHeader) {
			t.Errorf("signed by an old key after rotation: %v", err)
		}
	}
	// A rotation the old key did not sign (an attacker's key "rotating in").
	attacker := namedKey("attacker")
	forged := NewRotation(attacker, attacker)
	forged.From = r01.From
	m := Sign(attacker, base, []Rotation{forged})
	if _, err := m.VerifyHeader(pubOf(k0), edge); !errors.Is(err, ErrHeader) {
		t.Errorf("rotation not signed by the old key: %v", err)
	}
	// Signed by the old key only: the new key must sign too.
	half := r01
	half.ToSignature = NewRotation(k1, k1).ToSignature
	m = Sign(k1, base, []Rotation{half})
	if _, err := m.VerifyHeader(pubOf(k0), edge); !errors.Is(err, ErrHeader) {
		t.Errorf("rotation not signed by the new key: %v", err)
	}
	// The chain is covered by the header's signature.
	m = chain
	m.Header.Rotations = []Rotation{r01}
	if _, err := m.VerifyHeader(pubOf(k0), edge); !errors.Is(err, ErrHeader) {
		t.Errorf("chain edited after signing: %v", err)
	}
}

func TestCollectChecksHeaders(t *testing.T) {
	_, priv := key(t)
	m := manifestOf(t, priv, 9, 1200)
	other := manifestOf(t, priv, 9, 3)
	mixed := Paginate(m, MaxEntries)
	mixed[1].Header, mixed[1].HeaderSignature = other.Header, other.HeaderSignature
	if _, err := Collect(context.Background(), pager(mixed), edge, 0); !errors.Is(err, ErrHeader) {
		t.Errorf("pages with different headers: %v", err)
	}
	extra := Paginate(m, MaxEntries)
	extra[2].Entries = append(slices.Clone(extra[2].Entries), NewEntry(priv, edge, "zz.example.com", "shared-default", 1, artifact("zz.example.com")))
	if _, err := Collect(context.Background(), pager(extra), edge, 0); !errors.Is(err, ErrHeader) {
		t.Errorf("more entries than the header counts: %v", err)
	}
	unsigned := Paginate(Manifest{EdgeID: edge, Sequence: 10}, MaxEntries)
	got, err := Collect(context.Background(), pager(unsigned), edge, 0)
	if !errors.Is(err, ErrHeader) || got.Sequence != 10 {
		t.Errorf("unsigned manifest: sequence %d, %v", got.Sequence, err)
	}
	huge := Paginate(Sign(priv, Manifest{EdgeID: edge, Sequence: math.MaxInt64}, nil), MaxEntries)
	got, err = Collect(context.Background(), pager(huge), edge, 0)
	if !errors.Is(err, ErrInvalid) || got.Sequence != 0 {
		t.Errorf("sequence 2^63-1: acked as sequence %d, %v; want a malformed refusal without its sequence", got.Sequence, err)
	}
	var p Page
	if err := json.Unmarshal([]byte(`{"edge_id":"e","sequence":9007199254740992,"entries":[]}`), &p); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("sequence 2^53: %v", err)
	}
}

// FuzzVerifyHeader decodes a page as the agent does, collects it and
// verifies its header: whatever is accepted must be exactly what was signed.
func FuzzVerifyHeader(f *testing.F) {
	pub, priv := key(f)
	f.Add(encode(f, Paginate(manifestOf(f, priv, 2, 2), 500)[0]))
	f.Add(encode(f, Paginate(Sign(priv, Manifest{EdgeID: edge, Sequence: 3}, []Rotation{NewRotation(namedKey("a"), priv)}), 500)[0]))
	f.Add([]byte(`{"edge_id":"e","sequence":1,"entries":[],"header":{"edge_id":"e","sequence":1,"entries":0,"entries_digest":"","assignments_digest":""},"header_signature":"AAAA"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePage(data)
		if err != nil {
			return
		}
		p.Next = ""
		m, err := Collect(context.Background(), pager([]Page{p}), edge, 0)
		if err != nil {
			return
		}
		signer, err := m.VerifyHeader(pub, edge)
		if err != nil {
			return
		}
		sig, _ := base64.StdEncoding.DecodeString(m.HeaderSignature)
		if !ed25519.Verify(signer, m.Header.SigningMessage(), sig) || m.Header.Entries != len(m.Entries) ||
			m.Header.Sequence != m.Sequence || m.Header.EdgeID != edge || m.Sequence > MaxSequence {
			t.Fatalf("accepted a manifest its header does not cover: %+v", m.Header)
		}
	})
}

// Cell assignments are covered by the header: changing a cell's pool or a
// pool's limits, adding or dropping them, is refused; an entry's cells are
// covered by its own signature.
func TestAssignmentsSigned(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	pub := priv.Public().(ed25519.PublicKey)
	art := []byte(`{"domain":"a.example.com"}`)
	e := NewEntry(priv, "edge-1", "a.example.com", "reserved-eu", 1, art)
	asg := &Assignments{
		Cells: map[string]string{"cell-01": "shared-default", "cell-03": "reserved-eu", "cell-04": "reserved-eu"},
		Pools: map[string]PoolPolicy{
			"shared-default": {Class: "shared", MaxConns: 1000, Rate: 100, Burst: 200},
			"reserved-eu":    {Class: "reserved", MaxConns: 5000},
		},
	}
	good := Sign(priv, Manifest{EdgeID: "edge-1", Sequence: 3, Entries: []Entry{e}, Assignments: asg}, nil)
	if _, err := good.VerifyHeader(pub, "edge-1"); err != nil {
		t.Fatalf("signed assignments: %v", err)
	}
	clone := func(m Manifest) Manifest {
		a := &Assignments{Cells: map[string]string{}, Pools: map[string]PoolPolicy{}}
		for k, v := range m.Assignments.Cells {
			a.Cells[k] = v
		}
		for k, v := range m.Assignments.Pools {
			a.Pools[k] = v
		}
		m.Assignments = a
		return m
	}
	for name, tamper := range map[string]func(*Manifest){
		"a cell repurposed": func(m *Manifest) { m.Assignments.Cells["cell-01"] = "reserved-eu" },
		"a cell added":      func(m *Manifest) { m.Assignments.Cells["cell-05"] = "shared-default" },
		"a cell dropped":    func(m *Manifest) { delete(m.Assignments.Cells, "cell-04") },
		"a limit loosened": func(m *Manifest) {
			p := m.Assignments.Pools["shared-default"]
			p.Rate = 0
			m.Assignments.Pools["shared-default"] = p
		},
		"assignments gone": func(m *Manifest) { m.Assignments = nil },
		"signed without assignments": func(m *Manifest) {
			m.Header.AssignmentsDigest = ""
			m.Assignments = nil
			m.HeaderSignature = SignHeader(priv, m.Header)
		},
	} {
		m := clone(good)
		tamper(&m)
		if name == "signed without assignments" {
			// Signed by the key, but without the assignments: accepted, as
			// a manifest that leaves them as they are.
			if _, err := m.VerifyHeader(pub, "edge-1"); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if _, err := m.VerifyHeader(pub, "edge-1"); !errors.Is(err, ErrHeader) {
			t.Errorf("%s: %v, want ErrHeader", name, err)
		}
	}
	// An entry's cells are signed with it.
	e.Cells = []string{"cell-03", "cell-04"}
	e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, SigningMessage("edge-1", e)))
	if err := e.Verify(pub, "edge-1", art); err != nil {
		t.Fatalf("entry with cells: %v", err)
	}
	moved := e
	moved.Cells = []string{"cell-01"}
	if err := moved.Verify(pub, "edge-1", art); !errors.Is(err, ErrSignature) {
		t.Errorf("entry moved to another cell without the key: %v, want ErrSignature", err)
	}
	for _, cells := range [][]string{{"cell-04", "cell-03"}, {"cell-03", "cell-03"}, {"cell-3"}} {
		bad := e
		bad.Cells = cells
		if err := bad.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("cells %q: %v, want ErrInvalid", cells, err)
		}
	}
	// Policies are checked.
	for name, a := range map[string]Assignments{
		"pool without policy": {Cells: map[string]string{"cell-01": "shared-x"}, Pools: map[string]PoolPolicy{}},
		"policy without cell": {Cells: map[string]string{}, Pools: map[string]PoolPolicy{"shared-x": {Class: "shared"}}},
		"wrong class":         {Cells: map[string]string{"cell-01": "shared-x"}, Pools: map[string]PoolPolicy{"shared-x": {Class: "reserved"}}},
		"negative rate":       {Cells: map[string]string{"cell-01": "shared-x"}, Pools: map[string]PoolPolicy{"shared-x": {Class: "shared", Rate: -1}}},
		"bad cell name":       {Cells: map[string]string{"cell-1": "shared-x"}, Pools: map[string]PoolPolicy{"shared-x": {Class: "shared"}}},
	} {
		if err := a.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestIsCellName(t *testing.T) {
	for name, want := range map[string]bool{
		"cell-01": true, "cell-99": true,
		"cell-1": false, "cell-001": false, "cell-0a": false, "cell-/1": false, "cell-:1": false, "CELL-01": false, "": false,
	} {
		if got := isCellName(name); got != want {
			t.Errorf("isCellName(%q) = %v, want %v", name, got, want)
		}
	}
}
