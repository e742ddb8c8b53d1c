package supervisor_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"cellvisor/manifest"
	"cellvisor/supervisor"
)

// A cell at the largest sequence (2^53−1) reports it exactly, and drain and
// undrain work on it: marker, cell and status agree. (The cell's Lua used
// to round it, so that every drain "failed" after it had worked.)
func TestLargestSequenceDrainAgrees(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1, sequence: manifest.MaxSequence, exposeCell: true}) // its readiness page says the sequence
	port := h.waitReady("cell-01", 0).HTTPPort
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if seq, running, err := h.sup.Loaded(ctx, "cell-01"); err != nil || !running || seq != manifest.MaxSequence {
		t.Fatalf("loaded %d, %v, %v; want %d", seq, running, err, int64(manifest.MaxSequence))
	}
	if _, body, err := get(port, "/.cellvisor/ready"); err != nil || !strings.Contains(body, "sequence 9007199254740991") {
		t.Errorf("readiness %q, %v", body, err)
	}
	st, err := h.sup.Drain(ctx, "cell-01")
	if err != nil || st.State != supervisor.StateDrained {
		t.Fatalf("drain: %+v, %v", st, err)
	}
	if code := readiness(t, port); code != 503 || !h.slotSpec("cell-01").Drained() {
		t.Errorf("drained: readiness %d, marker %v", code, h.slotSpec("cell-01").Drained())
	}
	if st, err := h.sup.Undrain(ctx, "cell-01"); err != nil || st.State != supervisor.StateReady {
		t.Fatalf("undrain: %+v, %v", st, err)
	}
}

// A drain whose cell call fails after the marker was written leaves the
// marker, the cell and status agreeing that the cell serves.
func TestFailedDrainAgrees(t *testing.T) {
	h := newHarness(t, harnessOpts{slots: 1})
	port := h.waitReady("cell-01", 0).HTTPPort
	spec := h.slotSpec("cell-01")
	secret, err := os.ReadFile(spec.SecretFile())
	if err != nil {
		t.Fatal(err)
	}
	// The agent now signs its calls with a secret the cell does not hold.
	if err := os.WriteFile(spec.SecretFile(), []byte(strings.Repeat("0", 64)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := h.sup.Drain(ctx, "cell-01"); err == nil {
		t.Fatal("drain with a refused call succeeded")
	}
	if err := os.WriteFile(spec.SecretFile(), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := readiness(t, port); code != 200 || spec.Drained() || h.slot("cell-01").State != supervisor.StateReady {
		t.Errorf("after a failed drain: readiness %d, marker %v, status %s; want all serving", code, spec.Drained(), h.slot("cell-01").State)
	}
}
