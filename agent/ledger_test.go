package agent

import (
	"os"
	"path/filepath"
	"testing"

	"cellvisor/edgeapi"
)

func TestLedgerSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tasks.json")
	l, err := openLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.outcome(7); ok {
		t.Fatal("an empty ledger knows task 7")
	}
	if err := l.record(7, edgeapi.TaskAck{State: edgeapi.TaskDone, Result: "ready"}); err != nil {
		t.Fatal(err)
	}
	if err := l.record(8, edgeapi.TaskAck{State: edgeapi.TaskFailed, Result: "rate limited"}); err != nil {
		t.Fatal(err)
	}
	// A restarted agent knows both outcomes and runs neither again.
	again, err := openLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok := again.outcome(7); !ok || a.State != edgeapi.TaskDone || a.Result != "ready" {
		t.Fatalf("task 7 after a restart: %+v, %v", a, ok)
	}
	if err := again.forget(7); err != nil {
		t.Fatal(err)
	}
	third, _ := openLedger(path)
	if _, ok := third.outcome(7); ok {
		t.Fatal("a forgotten task came back")
	}
	if a, ok := third.outcome(8); !ok || a.State != edgeapi.TaskFailed {
		t.Fatalf("task 8: %+v, %v", a, ok)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("ledger mode %04o", st.Mode().Perm())
	}
	os.WriteFile(path, []byte("{not json"), 0o600)
	damaged, err := openLedger(path)
	if err == nil {
		t.Fatal("a damaged ledger was accepted")
	}
	// The agent carries on with an empty one, which writes over the damage.
	if err := damaged.record(9, edgeapi.TaskAck{State: edgeapi.TaskDone}); err != nil {
		t.Fatal(err)
	}
	if l, err := openLedger(path); err != nil {
		t.Fatalf("ledger after carrying on: %v", err)
	} else if _, ok := l.outcome(9); !ok {
		t.Fatal("task 9 lost")
	}
}
