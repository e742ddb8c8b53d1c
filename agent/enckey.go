package agent

import (
	"context"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/internal/backoff"
	"cellvisor/tlsseal"
)

// loadEncryptionKey reads the edge's encryption key, which opens the
// certificates' keys sealed to it, making one when an edge enrolled before
// them has none (registerLoop then sends it to the control API). Without
// one, manifests carrying sealed keys are refused; HTTP still serves.
func (a *Agent) loadEncryptionKey() {
	k, err := controlclient.EnsureEncryptionKey(a.cfg.IdentityDir())
	if err != nil {
		a.log.Error("encryption key unusable: manifests with certificate keys will be refused", zap.Error(err))
		return
	}
	a.encKey = k
}

// registerLoop registers the edge's encryption key with the control API
// (the same key again changes nothing there), retrying with backoff until
// it is taken: an edge enrolled before encryption keys thus upgrades in
// place, on its first poll.
func (a *Agent) registerLoop(ctx context.Context) {
	if a.encKey == nil {
		return
	}
	b := &backoff.Backoff{Initial: 5 * time.Second, Max: a.cfg.Source.MaxBackoff.D()}
	for {
		err := a.client.RegisterEncryptionKey(ctx, a.encKey.PublicKey())
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			a.log.Info("encryption key registered", zap.String("key_id", tlsseal.KeyID(a.encKey.PublicKey())))
			return
		}
		delay := b.Next()
		a.log.Warn("register the encryption key", zap.Duration("retry_in", delay), zap.Error(err))
		if backoff.Sleep(ctx, nil, delay) != nil {
			return
		}
	}
}
