// Package controlclient is the agent's side of the control plane:
// enrollment, the outbound mutual-TLS client of the edge-control API and
// the renewal of its client certificate, the acknowledgement journal, which
// makes every ack durable before it is sent and resends it until the
// control plane takes it, and the spool directory source. It links no
// control-plane code. activation, outbound, agent and cmd/cellvisor import
// it.
package controlclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"cellvisor/internal/atomicfile"
	"cellvisor/internal/backoff"
	"cellvisor/manifest"
)

// Journal is an append-only file of acknowledgements not yet delivered:
// each is fsynced before it is sent, survives agent restarts, and is
// compacted away once the control plane has taken it.
type Journal struct {
	path string
	log  *zap.Logger
	wake chan struct{}

	mu      sync.Mutex // guards the following fields and the file
	pending []manifest.Ack
	dropped int // damaged lines dropped at open
}

// MaxJournalLine bounds one line of the ack journal: an ack whose reason
// is cut to manifest.MaxReasonBytes takes well under 1 KiB.
const MaxJournalLine = 64 << 10

// OpenJournal reads the journal at path (creating none yet). It never
// refuses to start over what it finds: a torn last line, from a crash in the
// middle of a write, is dropped (its ack was never sent, and the activation
// that made it is redone); a damaged or overlong line anywhere else is
// dropped too, logged and counted (Dropped), and the acks around it are
// kept. Only a journal that cannot be read or rewritten at all is an error.
func OpenJournal(path string, log *zap.Logger) (*Journal, error) {
	if log == nil {
		log = zap.NewNop()
	}
	j := &Journal{path: path, log: log.Named("acks"), wake: make(chan struct{}, 1)}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	switch {
	case os.IsNotExist(err):
		return j, j.rewriteLocked()
	case err != nil:
		return nil, fmt.Errorf("read ack journal: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("read ack journal %s: not a regular file", path)
	}
	if err := j.readLines(bufio.NewReaderSize(f, 64<<10)); err != nil {
		return nil, fmt.Errorf("read ack journal %s: %w", path, err)
	}
	return j, j.rewriteLocked()
}

// readLines keeps every line that decodes as an ack, holding at most
// MaxJournalLine bytes of one line in memory.
func (j *Journal) readLines(r *bufio.Reader) error {
	var line []byte
	for n := 1; ; n++ {
		line = line[:0]
		long, torn, eof := false, false, false
		for {
			chunk, err := r.ReadSlice('\n')
			if long || len(line)+len(chunk) > MaxJournalLine+1 {
				long = true // keep reading to the end of the line, not the line
			} else {
				line = append(line, chunk...)
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err == io.EOF {
				torn, eof = len(line) > 0 || long, true
				break
			}
			if err != nil {
				return err
			}
			break
		}
		switch {
		case torn && !long && len(bytes.TrimSpace(line)) > 0 && !json.Valid(line):
			// The last line, never finished: a crash mid-append, whose ack
			// was never sent and whose activation is redone.
			j.log.Warn("dropping a torn last ack journal line", zap.Int("line", n))
		case long:
			j.dropped++
			j.log.Error("ack journal line over its bound; it is dropped", zap.Int("line", n), zap.Int("max_bytes", MaxJournalLine))
		case len(bytes.TrimSpace(line)) == 0:
		default:
			var a manifest.Ack
			if err := json.Unmarshal(line, &a); err != nil {
				j.dropped++
				j.log.Error("ack journal line is damaged; it is dropped", zap.Int("line", n), zap.String("error", manifest.Reason(err)))
				break
			}
			a.Reason = manifest.CutReason(a.Reason)
			j.pending = append(j.pending, a)
		}
		if eof {
			return nil
		}
	}
}

// Dropped is the number of damaged or overlong journal lines dropped when
// the journal was opened: acks the control plane will never get.
func (j *Journal) Dropped() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.dropped
}

// Append makes a durable: written and fsynced before Append returns.
// The reason is cut and escaped (manifest.CutReason): it may carry text an
// attacker chose.
func (j *Journal) Append(a manifest.Ack) error {
	a.Reason = manifest.CutReason(a.Reason)
	line, err := json.Marshal(a)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("ack journal: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("ack journal: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("ack journal: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	j.pending = append(j.pending, a)
	select {
	case j.wake <- struct{}{}:
	default:
	}
	return nil
}

// Pending returns the acks not yet delivered, oldest first.
func (j *Journal) Pending() []manifest.Ack {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]manifest.Ack(nil), j.pending...)
}

// delivered removes the oldest pending ack and compacts the file.
func (j *Journal) delivered(a manifest.Ack) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.pending) > 0 && j.pending[0].Sequence == a.Sequence && j.pending[0].Status == a.Status {
		j.pending = j.pending[1:]
	}
	return j.rewriteLocked()
}

// rewriteLocked replaces the file with the pending acks, atomically.
func (j *Journal) rewriteLocked() error {
	var b bytes.Buffer
	for _, a := range j.pending {
		line, err := json.Marshal(a)
		if err != nil {
			return err
		}
		b.Write(append(line, '\n'))
	}
	if err := atomicfile.WriteFile(j.path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("compact ack journal: %w", err)
	}
	return nil
}

// Run sends pending acks in order until ctx ends, retrying each with
// backoff (from 100ms, capped at maxDelay, ±50% jitter, reset on success).
func (j *Journal) Run(ctx context.Context, send func(context.Context, manifest.Ack) error, maxDelay time.Duration) {
	b := &backoff.Backoff{Initial: 100 * time.Millisecond, Max: maxDelay}
	for {
		pending := j.Pending()
		if len(pending) == 0 {
			select {
			case <-ctx.Done():
				return
			case <-j.wake:
				continue
			}
		}
		a := pending[0]
		err := send(ctx, a)
		var perm interface{ Permanent() bool }
		if err != nil && errors.As(err, &perm) && perm.Permanent() {
			// Sending it again would be refused again, and would hold back
			// every ack after it.
			j.log.Error("ack refused by the control API; dropping it", zap.Int64("sequence", a.Sequence), zap.Error(err))
			if err := j.delivered(a); err != nil {
				j.log.Error("ack journal", zap.Error(err))
			}
			continue
		}
		if err != nil {
			delay := b.Next()
			j.log.Warn("ack not delivered; will retry", zap.Int64("sequence", a.Sequence), zap.Duration("in", delay), zap.Error(err))
			if backoff.Sleep(ctx, nil, delay) != nil {
				return
			}
			continue
		}
		b.Reset()
		if err := j.delivered(a); err != nil {
			j.log.Error("ack journal", zap.Error(err))
		}
		j.log.Info("ack delivered", zap.Int64("sequence", a.Sequence), zap.String("status", a.Status))
	}
}
