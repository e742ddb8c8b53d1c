package activation

import (
	"bytes"
	"fmt"
	"testing"

	"cellvisor/domain"
	"cellvisor/runtime"
)

// The pool runtime JSON written from spilled documents is byte for byte the
// one written from memory, and the spilled domains hold no configuration.
func TestSpilledPoolJSONIsTheSame(t *testing.T) {
	var inMemory []domain.Domain
	for i := range 50 {
		name := fmt.Sprintf("d%d.example.com", i)
		d, err := domain.Decode(domainJSON(name, domain.PoolSharedDefault, 3, fmt.Sprintf("body %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		inMemory = append(inMemory, d)
	}
	s, err := newDocSpill(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	spilled := make([]domain.Domain, len(inMemory))
	for i, d := range inMemory {
		if spilled[i], err = s.put(d); err != nil {
			t.Fatal(err)
		}
		if spilled[i].Canonical() != nil || spilled[i].Routes != nil {
			t.Fatalf("%s still holds its configuration after the spill", d.Domain)
		}
	}
	want, err := runtime.CompilePools(inMemory)
	if err != nil {
		t.Fatal(err)
	}
	got, err := runtime.CompilePools(spilled)
	if err != nil {
		t.Fatal(err)
	}
	s.attach(got)
	var a, b bytes.Buffer
	if err := want[domain.PoolSharedDefault].WriteJSON(&a); err != nil {
		t.Fatal(err)
	}
	if err := got[domain.PoolSharedDefault].WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) || a.Len() < 1000 {
		t.Errorf("spilled pool JSON (%d bytes) differs from the in-memory one (%d bytes)", b.Len(), a.Len())
	}
	// Once closed, a pool cannot be written: the spill is not silently empty.
	s.close()
	if err := got[domain.PoolSharedDefault].WriteJSON(&bytes.Buffer{}); err == nil {
		t.Error("a pool wrote from a closed spill")
	}
}
