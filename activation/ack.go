package activation

import (
	"fmt"
	"strings"

	"go.uber.org/zap"

	"cellvisor/manifest"
)

// refuse journals a refusal ack, once for the same sequence and reason (a
// source keeps serving a bad manifest until it is replaced); the previous
// release stays active.
func (a *Activator) refuse(seq int64, why error) error {
	key := fmt.Sprintf("%d\x00%s", seq, why)
	a.mu.Lock()
	again := a.refused == key
	a.mu.Unlock()
	if again {
		return nil
	}
	a.log.Error("manifest refused; the previous release stays active", zap.Int64("sequence", seq), zap.Error(why))
	if err := a.o.Journal.Append(manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: why.Error(), At: a.clock.Now().UTC()}); err != nil {
		return err
	}
	a.mu.Lock()
	a.refused = key
	a.mu.Unlock()
	return nil
}

// alreadyRefused tells whether seq was refused (for any reason) last.
func (a *Activator) alreadyRefused(seq int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return seq != 0 && strings.HasPrefix(a.refused, fmt.Sprintf("%d\x00", seq))
}
