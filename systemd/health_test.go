package systemd

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cellvisor/internal/clock"
)

// beater is a loop's heartbeat as the loop would keep it.
type beater struct{ ns atomic.Int64 }

func (b *beater) mark(t time.Time) { b.ns.Store(t.UnixNano()) }
func (b *beater) last() time.Time {
	if ns := b.ns.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func TestHealthStaleOnlyPastEachBound(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	h := NewHealth(clk)
	var sup, act beater
	h.Watch("supervisor", sup.last, 30*time.Second)
	h.Watch("activation", act.last, 10*time.Minute)

	steps := []struct {
		name    string
		advance time.Duration
		mark    []*beater
		stale   []string // loops Check must name; none: healthy
	}{
		{name: "fresh start, nothing marked yet: grace from Watch", advance: 0},
		{name: "unmarked supervisor at its bound", advance: 30 * time.Second},
		{name: "unmarked supervisor past its bound", advance: time.Second, stale: []string{"supervisor"}},
		{name: "supervisor marks: healthy", mark: []*beater{&sup}},
		{name: "activation still in its first poll", advance: 29 * time.Second},
		{name: "supervisor silent again", advance: 2 * time.Second, mark: []*beater{&act}, stale: []string{"supervisor"}},
		{name: "both loops alive", mark: []*beater{&sup, &act}},
		{name: "activation inside a long poll, supervisor ticking", advance: 9 * time.Minute, mark: []*beater{&sup}},
		{name: "activation past its bound", advance: 61 * time.Second, mark: []*beater{&sup}, stale: []string{"activation"}},
		{name: "both past their bounds", advance: 31 * time.Second, stale: []string{"supervisor", "activation"}},
		{name: "both recover", mark: []*beater{&sup, &act}},
	}
	for _, st := range steps {
		clk.Advance(st.advance)
		for _, b := range st.mark {
			b.mark(clk.Now())
		}
		err := h.Check()
		if len(st.stale) == 0 {
			if err != nil {
				t.Fatalf("%s: Check() = %v, want healthy", st.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrStale) {
			t.Fatalf("%s: Check() = %v, want ErrStale", st.name, err)
		}
		for _, n := range []string{"supervisor", "activation"} {
			want := slices.Contains(st.stale, n)
			if got := strings.Contains(err.Error(), n+" for "); got != want {
				t.Errorf("%s: %q names %s: %v, want %v", st.name, err, n, got, want)
			}
		}
	}
}

// A heartbeat older than Watch (a loop that marked before the watchdog was
// set up) counts from Watch, not from its old mark.
func TestHealthOldMarkCountsFromWatch(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	var b beater
	b.mark(clk.Now().Add(-time.Hour))
	h := NewHealth(clk)
	h.Watch("loop", b.last, time.Minute)
	if err := h.Check(); err != nil {
		t.Fatalf("Check() at Watch = %v", err)
	}
	clk.Advance(time.Minute + time.Second)
	if err := h.Check(); !errors.Is(err, ErrStale) {
		t.Fatalf("Check() a minute after Watch = %v, want ErrStale", err)
	}
}
