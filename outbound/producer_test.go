package outbound

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// noControl is a control API the producer's tests never reach: their
// senders journal bundles and are not run.
type noControl struct{}

func (noControl) Elect(context.Context, edgeapi.ElectRequest) (edgeapi.ElectResponse, error) {
	return edgeapi.ElectResponse{}, errors.New("not in this test")
}

func (noControl) Fence(context.Context, edgeapi.FenceRequest) error {
	return errors.New("not in this test")
}

// producerEnv is a producer's state directory and the sample its cell
// reports; open starts a producer on it as an agent (re)starting would.
type producerEnv struct {
	t       *testing.T
	dir     string
	maxJour int
	sample  CellSample
	journal *Journal
}

func newProducerEnv(t *testing.T) *producerEnv {
	return &producerEnv{t: t, dir: t.TempDir(), maxJour: 100, sample: CellSample{Cell: "cell-01", Pool: "shared-default"}}
}

// openJournal opens the state directory's journal, as a starting agent does.
func (e *producerEnv) openJournal() *Journal {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	j, err := OpenJournal(ctx, filepath.Join(e.dir, "journal"), e.maxJour, 1<<20, zaptest.NewLogger(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	e.journal = j
	return j
}

// open starts a producer (and its journal) on the state directory.
func (e *producerEnv) open() *Producer {
	e.t.Helper()
	log := zaptest.NewLogger(e.t)
	s, err := NewSender(Options{EdgeID: "e1", Org: "acme", Control: noControl{}, Journal: e.openJournal(), Logger: log})
	if err != nil {
		e.t.Fatal(err)
	}
	return NewProducer(s, e.dir, func(context.Context) []CellSample { return []CellSample{e.sample} })
}

// persisted reads the producer's counters file.
func (e *producerEnv) persisted() counters {
	e.t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dir, "counters.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	var c counters
	if err := json.Unmarshal(data, &c); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// crashedWith writes the counters file a producer leaves when its agent
// ends between persisting its counters with their pending bundle and the
// end of Produce: the auth failures counted up to 3, one bundle of 3.
func (e *producerEnv) crashedWith(t *testing.T) edgeapi.Bundle {
	t.Helper()
	at := time.Now().UTC()
	b, err := NewBundle("acme", "e1", egress.SIEMForwarding, at, []SecurityEvent{{Cell: "cell-01", Kind: "auth_failure", Count: 3, ObservedAt: at}})
	if err != nil {
		t.Fatal(err)
	}
	prev := counters{At: at.Add(-time.Second), Cells: map[string]cellCounters{"cell-01": {}}}
	c := counters{At: at, Cells: map[string]cellCounters{"cell-01": {AuthFailures: 3}}, Pending: []edgeapi.Bundle{b}, Prev: &prev}
	data, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(e.dir, "counters.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

func countsOf(t *testing.T, bs []edgeapi.Bundle) (ids []string, total int64) {
	t.Helper()
	for _, b := range bs {
		ids = append(ids, b.ID)
		var items []SecurityEvent
		if err := json.Unmarshal(b.Items, &items); err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			total += it.Count
		}
	}
	return ids, total
}

// Each bundle a producer made is journaled once, under its own id, however
// the agent ended: before the bundle was journaled (it is submitted again
// at the next start), or after (the journal holds it already). A restart
// counts nothing twice.
func TestProducerResubmitsItsPendingBundle(t *testing.T) {
	for _, journaled := range []bool{false, true} {
		name := map[bool]string{false: "ended before journaling", true: "ended after journaling"}[journaled]
		t.Run(name, func(t *testing.T) {
			e := newProducerEnv(t)
			b := e.crashedWith(t)
			if journaled {
				if err := e.openJournal().Put(b); err != nil {
					t.Fatal(err)
				}
			}
			p := e.open()
			ids, total := countsOf(t, e.journal.Pending(string(egress.SIEMForwarding)))
			if len(ids) != 1 || ids[0] != b.ID || total != 3 {
				t.Fatalf("journaled %v counting %d, want the pending bundle %s alone, counting 3", ids, total, b.ID)
			}
			if c := e.persisted(); len(c.Pending) != 0 || c.Prev != nil || c.Cells["cell-01"].AuthFailures != 3 {
				t.Errorf("counters after the restart %+v: want 3 counted, nothing pending", c)
			}
			// The cell still reports 3, then 5: only the 2 new ones are sent.
			e.sample.AuthFailures = 3
			p.Produce(context.Background())
			e.sample.AuthFailures = 5
			p.Produce(context.Background())
			if ids, total := countsOf(t, e.journal.Pending(string(egress.SIEMForwarding))); len(ids) != 2 || total != 5 {
				t.Errorf("journaled %v counting %d, want 2 bundles counting 5", ids, total)
			}
		})
	}
}

// A pending bundle the journal refuses at the restart gives its class its
// counters back: the next bundle counts its events.
func TestProducerRefusedPendingBundleIsCountedAgain(t *testing.T) {
	e := newProducerEnv(t)
	e.maxJour = 1
	e.crashedWith(t)
	e.open() // resubmits it, and the journal (of one) is full
	other := e.crashedWith(t)
	p := e.open()
	if ids, _ := countsOf(t, e.journal.Pending(string(egress.SIEMForwarding))); len(ids) != 1 || ids[0] == other.ID {
		t.Fatalf("journaled %v: want the first bundle alone (the journal holds one)", ids)
	}
	if c := e.persisted(); len(c.Pending) != 0 || c.Cells["cell-01"].AuthFailures != 0 {
		t.Fatalf("counters after the refusal %+v: want the auth failures back at 0, nothing pending", c)
	}
	// Once the journal has room, the next bundle counts the 3 again.
	for _, b := range e.journal.Pending(string(egress.SIEMForwarding)) {
		if err := e.journal.Remove(b.ID); err != nil {
			t.Fatal(err)
		}
	}
	e.sample.AuthFailures = 3
	p.Produce(context.Background())
	if _, total := countsOf(t, e.journal.Pending(string(egress.SIEMForwarding))); total != 3 {
		t.Errorf("the next bundle counts %d, want the 3 refused before", total)
	}
}

// Produce persists its counters with their bundle before the bundle is
// journaled, and without it after.
func TestProducerPersistsPendingBeforeJournaling(t *testing.T) {
	e := newProducerEnv(t)
	p := e.open()
	p.Produce(context.Background()) // the baseline
	e.sample.AuthFailures, e.sample.Requests = 2, 7
	var seen []counters
	journaledBefore := 0
	p.beforeSubmit = func() {
		seen = append(seen, e.persisted())
		journaledBefore = len(e.journal.Pending(string(egress.Metering))) + len(e.journal.Pending(string(egress.SIEMForwarding)))
	}
	p.Produce(context.Background())
	if len(seen) != 1 || len(seen[0].Pending) != 2 || seen[0].Prev == nil || seen[0].Cells["cell-01"].AuthFailures != 2 {
		t.Fatalf("counters before the bundles were journaled %+v: want both bundles pending, with the counters before them", seen)
	}
	if journaledBefore != 0 {
		t.Errorf("%d bundles journaled before the counters naming them were persisted", journaledBefore)
	}
	for _, b := range seen[0].Pending {
		if got := e.journal.Pending(b.Class); len(got) != 1 || got[0].ID != b.ID {
			t.Errorf("%s: journaled %v, want the pending bundle %s", b.Class, got, b.ID)
		}
	}
	if c := e.persisted(); len(c.Pending) != 0 || c.Prev != nil {
		t.Errorf("counters after Produce %+v: want nothing pending", c)
	}
}

// meteredTotal sums the requests of the journal's metering bundles.
func meteredTotal(t *testing.T, j *Journal) int64 {
	t.Helper()
	var total int64
	for _, b := range j.Pending(string(egress.Metering)) {
		var items []Metering
		if err := json.Unmarshal(b.Items, &items); err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			total += it.Requests
		}
	}
	return total
}

// Metering counts every request a cell served exactly once, across agent
// restarts whose first sample comes before the cells are adopted, samples
// that miss a cell, and cell restarts (its counters start from 0, even on
// the same pid). Before, a cell missing from one sample lost its counters,
// and the next sample counted its whole lifetime again: a restarted agent
// billed every request its cells had ever served.
func TestMeteringIsExactAcrossRestartsAndMissedSamples(t *testing.T) {
	e := newProducerEnv(t)
	var served int64 // what the cell answered, as a client counts it
	cell := CellSample{Cell: "cell-01", Pool: "shared-default", Incarnation: "100@1"}
	present := true
	serve := func(n int64) { cell.Requests += n; served += n }
	var p *Producer
	start := func() {
		log := zaptest.NewLogger(t)
		s, err := NewSender(Options{EdgeID: "e1", Org: "acme", Control: noControl{}, Journal: e.openJournal(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		p = NewProducer(s, e.dir, func(context.Context) []CellSample {
			if !present {
				return nil
			}
			return []CellSample{cell}
		})
	}
	start()
	serve(7) // before the first sample: the baseline of a new agent
	p.Produce(context.Background())
	served = 0 // the baseline itself is not billed
	serve(5)
	p.Produce(context.Background())

	// An agent restart: the first sample before the cell is adopted.
	serve(11)
	start()
	present = false
	p.Produce(context.Background())
	present = true
	serve(3)
	p.Produce(context.Background())

	// A sample that misses the cell (its status call failed), twice.
	serve(4)
	present = false
	p.Produce(context.Background())
	p.Produce(context.Background())
	present = true
	serve(6)
	p.Produce(context.Background())

	// A cell restart on the same pid, which counts past its old total
	// before the next sample: a new incarnation, counting from 0.
	cell.Requests, cell.Incarnation = 0, "100@2"
	serve(60)
	p.Produce(context.Background())

	// Another agent restart right after a cell restart.
	cell.Requests, cell.Incarnation = 0, "200@3"
	serve(2)
	start()
	present = false
	p.Produce(context.Background())
	present = true
	p.Produce(context.Background())

	if got := meteredTotal(t, e.journal); got != served {
		t.Errorf("metered %d requests, the cell served %d", got, served)
	}
}
