package clock

import (
	"testing"
	"time"
)

func TestFakeTimersAndTickers(t *testing.T) {
	f := NewFake(time.Unix(100, 0))
	tm := f.NewTimer(time.Second)
	tk := f.NewTicker(400 * time.Millisecond)
	stopped := f.NewTimer(time.Millisecond)
	if !stopped.Stop() || f.Waiters() != 2 {
		t.Fatalf("Stop of an armed timer: waiters %d, want 2", f.Waiters())
	}
	fired := func(c <-chan time.Time) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	f.Advance(999 * time.Millisecond)
	if fired(tm.C()) {
		t.Fatal("timer fired early")
	}
	if !fired(tk.C()) {
		t.Fatal("ticker did not fire at 400ms (and 800ms: one tick kept, as time.Ticker)")
	}
	f.Advance(time.Millisecond)
	if !fired(tm.C()) {
		t.Fatal("timer did not fire at 1s")
	}
	if fired(stopped.C()) {
		t.Fatal("a stopped timer fired")
	}
	f.Advance(200 * time.Millisecond)
	if !fired(tk.C()) {
		t.Fatal("ticker did not fire again at 1.2s")
	}
	tk.Stop()
	if f.Waiters() != 0 {
		t.Fatalf("%d waiters after every timer fired or stopped", f.Waiters())
	}
	if got := f.Since(time.Unix(100, 0)); got != 1200*time.Millisecond {
		t.Fatalf("Since = %s, want 1.2s", got)
	}
}
