package controlapi

import (
	"testing"
)

// BenchmarkAdmissionSlot is what admission adds to a request: a slot of
// its class taken and given back, from every core at once.
func BenchmarkAdmissionSlot(b *testing.B) {
	ad, err := newAdmitter(nil)
	if err != nil {
		b.Fatal(err)
	}
	sem := ad.sems[ClassPoll]
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			sl := &slot{sem: sem}
			if !sl.take() {
				b.Fatal("a class of 512 full with one request a core")
			}
			sl.release()
		}
	})
}

// A slot given back is taken again, and the class's bound holds: the
// bound-th slot is refused until one is given back.
func TestSlotsBoundTheirClass(t *testing.T) {
	ad, err := newAdmitter(Admission{ClassStatus: 2})
	if err != nil {
		t.Fatal(err)
	}
	sem := ad.sems[ClassStatus]
	a, b, c := &slot{sem: sem}, &slot{sem: sem}, &slot{sem: sem}
	if !a.take() || !b.take() {
		t.Fatal("two slots of a class of 2 refused")
	}
	if c.take() {
		t.Fatal("a third slot of a class of 2 taken")
	}
	a.release()
	a.release() // twice: given back once
	if !c.take() {
		t.Fatal("a slot given back could not be taken")
	}
	if a.take() {
		t.Fatal("a class of 2 held 3: a slot released twice counted twice")
	}
	if ad.limits[ClassPoll] != DefaultAdmission[ClassPoll] {
		t.Fatalf("poll limit %d, want the default %d", ad.limits[ClassPoll], DefaultAdmission[ClassPoll])
	}
}
