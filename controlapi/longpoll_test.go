package controlapi_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/manifest"
	"cellvisor/testkit/testutil"
)

// longPollClient is an edge's client of e that asks for holds of wait.
func (e *env) longPollClient(t *testing.T, dir string, wait time.Duration) *controlclient.Client {
	t.Helper()
	c, err := controlclient.New(controlclient.Options{URL: e.edgeURL, Dir: filepath.Join(dir, "identity"), LongPoll: wait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdle)
	return c
}

// held is how many polls e holds now.
func held(t *testing.T, e *env) float64 {
	t.Helper()
	fams, err := e.srv.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	return gauge(fams, "cellvisor_control_polls_held")
}

// pollResult is a Page's outcome, timed.
type pollResult struct {
	page manifest.Page
	err  error
	took time.Duration
}

// holdPoll starts a long poll after seq and waits until e holds it.
func holdPoll(t *testing.T, e *env, c *controlclient.Client, seq int64) <-chan pollResult {
	t.Helper()
	before := held(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	out := make(chan pollResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		p, err := c.Page(ctx, seq, "")
		out <- pollResult{p, err, time.Since(start)}
	}()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, 10*time.Second, func() error {
		if n := held(t, e); n != before+1 {
			return fmt.Errorf("%v polls held, want %v", n, before+1)
		}
		return nil
	})
	return out
}

// A long poll with nothing new is held, and answered at once when the
// edge's manifest moves (a publish), when a task is queued for it, or when
// the replica stops holding; with nothing at all, at the end of its wait.
func TestLongPolls(t *testing.T) {
	e := start(t, filepath.Join(t.TempDir(), "control.db"))
	a := e.createEdge(t, "a")
	_, _, dir := e.enroll(t, a.Token)
	c := e.longPollClient(t, dir, time.Minute)

	// While its poll is held, the edge's status reports and acks go
	// through on other connections of the same client.
	ch := holdPoll(t, e, c, 1)
	status := `{"version":"t","slots":[{"name":"cell-01","pool":"shared-default","state":"ready"}]}`
	if err := c.Report(ctx(t), edgeapi.StatusReport{At: time.Now(), Status: []byte(status)}); err != nil {
		t.Fatalf("status report while a poll is held: %v", err)
	}
	if err := c.Ack(ctx(t), manifest.Ack{Sequence: 1, Status: manifest.AckApplied, At: time.Now()}); err != nil {
		t.Fatalf("ack while a poll is held: %v", err)
	}
	if n := held(t, e); n != 1 {
		t.Fatalf("%v polls held after the report, want the one", n)
	}
	// A publish: answered with the new page, built for it.
	publish(t, e, "shop.example.test", "v1")
	r := <-ch
	if r.err != nil || r.page.Sequence != 2 || len(r.page.Entries) != 1 || r.took > 30*time.Second {
		t.Fatalf("held poll after a publish: sequence %d, %d entries, %v, after %s", r.page.Sequence, len(r.page.Entries), r.err, r.took)
	}

	// A task: answered 304, saying a task is pending.
	ch = holdPoll(t, e, c, 2)
	if _, err := e.admin.CreateTask(ctx(t), a.Edge.ID, adminapi.TaskRequest{Cell: "cell-01", Action: "drain"}); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; !errors.Is(r.err, manifest.ErrNoChange) || r.took > 30*time.Second {
		t.Fatalf("held poll after a task: %v after %s, want no change at once", r.err, r.took)
	}
	select {
	case <-c.TasksPending():
	default:
		t.Fatal("the answer to a held poll did not say a task is pending")
	}
	// With a task pending the poll is not held.
	start := time.Now()
	if _, err := c.Page(ctx(t), 2, ""); !errors.Is(err, manifest.ErrNoChange) || time.Since(start) > 30*time.Second {
		t.Fatalf("poll with a task pending: %v after %s", err, time.Since(start))
	}
	tasks, err := c.Tasks(ctx(t))
	if err != nil || len(tasks) != 1 {
		t.Fatalf("tasks %+v, %v", tasks, err)
	}
	if err := c.AckTask(ctx(t), tasks[0].ID, edgeapi.TaskAck{State: edgeapi.TaskDone, Result: "drained"}); err != nil {
		t.Fatal(err)
	}

	// Nothing at all: 304 at the end of the wait, a little before it.
	short := e.longPollClient(t, dir, time.Second)
	start = time.Now()
	_, err = short.Page(ctx(t), 2, "")
	if took := time.Since(start); !errors.Is(err, manifest.ErrNoChange) || took < 850*time.Millisecond || took > 30*time.Second {
		t.Fatalf("held poll with nothing new: %v after %s, want no change after about 1s", err, took)
	}

	// The replica stops holding (its edge listener shuts down).
	ch = holdPoll(t, e, c, 2)
	e.srv.StopHolds()
	if r := <-ch; !errors.Is(r.err, manifest.ErrNoChange) || r.took > 30*time.Second {
		t.Fatalf("held poll when the replica stops holding: %v after %s", r.err, r.took)
	}
	if n := held(t, e); n != 0 {
		t.Fatalf("%v polls still held", n)
	}
	// The request latency leaves the holds out: well under the one
	// second the poll above was held.
	fams, err := e.srv.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "cellvisor_control_http_request_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			if matches(m, map[string]string{"route": "GET /v1/manifest"}) && m.GetHistogram().GetSampleSum() > 0.8 {
				t.Errorf("GET /v1/manifest took %.2fs in all (code %v), holds included", m.GetHistogram().GetSampleSum(), m.GetLabel())
			}
		}
	}
}

// A poll held on one replica is answered when a domain is published
// through another, once its cache catches up (within its refresh).
func TestLongPollWokenByAnotherReplica(t *testing.T) {
	eachStore(t, func(t *testing.T, a *env) {
		b := a.replica(t)
		created := a.createEdge(t, "fra-1")
		_, _, dir := a.enroll(t, created.Token)
		cb := b.longPollClient(t, dir, time.Minute)
		ch := holdPoll(t, b, cb, 1)
		publish(t, a, "shop.example.test", "v1")
		r := <-ch
		if r.err != nil || r.page.Sequence != 2 || r.took > 30*time.Second {
			t.Fatalf("poll held on the other replica: sequence %d, %v after %s", r.page.Sequence, r.err, r.took)
		}
	})
}
