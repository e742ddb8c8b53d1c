package activation

import (
	"fmt"

	"go.uber.org/zap"

	"cellvisor/manifest"
)

// refuse journals a refusal ack, once for the same sequence and reason (a
// source keeps serving a bad manifest until it is replaced); the previous
// release stays active.
func (a *Activator) refuse(seq int64, why error) error {
	seq = ackSequence(seq)
	reason := manifest.Reason(why) // bounded and escaped: it quotes its input
	key := fmt.Sprintf("%d\x00%s", seq, reason)
	a.mu.Lock()
	again := a.refused == key
	a.mu.Unlock()
	if again {
		return nil
	}
	a.log.Error("manifest refused; the previous release stays active", zap.Int64("sequence", seq), zap.String("reason", reason))
	if err := a.o.Journal.Append(manifest.Ack{Sequence: seq, Status: manifest.AckRefused, Reason: reason, At: a.clock.Now().UTC()}); err != nil {
		return err
	}
	a.mu.Lock()
	a.refused = key
	a.mu.Unlock()
	a.noteRefusal(seq, why)
	return nil
}
