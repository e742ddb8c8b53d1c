package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"

	"cellvisor/edgeapi"
	"cellvisor/internal/atomicfile"
)

// ledger remembers the outcome of control tasks that ran but whose ack the
// control API has not taken yet, on disk, so that a task is acked again
// rather than run again, across agent restarts too (a restart task must not
// restart its cell twice).
type ledger struct {
	path string

	mu   sync.Mutex // guards done
	done map[int64]edgeapi.TaskAck
}

// openLedger reads the ledger at path; a missing file is an empty ledger.
// On an error it still returns an empty ledger at path, to carry on with.
func openLedger(path string) (*ledger, error) {
	l := &ledger{path: path, done: map[int64]edgeapi.TaskAck{}}
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("task ledger: %w", err)
	}
	var byID map[string]edgeapi.TaskAck
	if err := json.Unmarshal(data, &byID); err != nil {
		return l, fmt.Errorf("task ledger %s: %w", path, err)
	}
	for k, a := range byID {
		id, err := strconv.ParseInt(k, 10, 64)
		if err != nil {
			return &ledger{path: path, done: map[int64]edgeapi.TaskAck{}}, fmt.Errorf("task ledger %s: task id %q", path, k)
		}
		l.done[id] = a
	}
	return l, nil
}

// outcome returns what a task that already ran came to.
func (l *ledger) outcome(id int64) (edgeapi.TaskAck, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a, ok := l.done[id]
	return a, ok
}

// record durably notes a task's outcome, before its ack is sent.
func (l *ledger) record(id int64, a edgeapi.TaskAck) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done[id] = a
	return l.writeLocked()
}

// forget drops a task whose ack was taken.
func (l *ledger) forget(id int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.done[id]; !ok {
		return nil
	}
	delete(l.done, id)
	return l.writeLocked()
}

func (l *ledger) writeLocked() error {
	byID := make(map[string]edgeapi.TaskAck, len(l.done))
	for id, a := range l.done {
		byID[strconv.FormatInt(id, 10)] = a
	}
	data, err := json.Marshal(byID)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(l.path, data, 0o600); err != nil {
		return fmt.Errorf("task ledger: %w", err)
	}
	return nil
}
