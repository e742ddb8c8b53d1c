package activation

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"go.uber.org/zap"

	"cellvisor/internal/atomicfile"
	"cellvisor/manifest"
)

// State files beside active.json.
const (
	// pinnedKeyFile holds the control-plane key pinned after a rotation,
	// with the identity's key it was reached from: a re-enrollment (a new
	// identity key) starts from the identity's key again.
	pinnedKeyFile = "pinned-key.json"
	// revisionsFile holds each active domain's revision, the floor a
	// manifest may not go under without a signed rollback.
	revisionsFile = "revisions.json"
)

// trust is what the activation checks a whole manifest against: the
// pinned key and the active revisions.
type trust struct {
	dir string

	mu        sync.Mutex // guards the following fields
	key       ed25519.PublicKey
	identity  ed25519.PublicKey
	revisions map[string]int64
	// pending are the revisions of the manifest authenticated last, made
	// the floor once its sequence is active.
	pending    map[string]int64
	pendingSeq int64
	// refusedSig is the header signature of the manifest refused last
	// after it was authenticated: a forged manifest refused under the same
	// sequence does not hide the real one.
	refusedSig string
}

type pinnedKey struct {
	Identity string `json:"identity"`
	Key      string `json:"key"`
}

type revisionsDoc struct {
	Sequence  int64            `json:"sequence"`
	Revisions map[string]int64 `json:"revisions"`
}

// loadTrust reads the pinned key (the identity's unless a rotation moved
// it on) and the active revisions from dir.
func loadTrust(dir string, identity ed25519.PublicKey) (*trust, error) {
	t := &trust{dir: dir, key: identity, identity: identity, revisions: map[string]int64{}}
	data, err := os.ReadFile(filepath.Join(dir, pinnedKeyFile))
	switch {
	case err == nil:
		var p pinnedKey
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, fmt.Errorf("read pinned key: %w", err)
		}
		from, err1 := base64.StdEncoding.DecodeString(p.Identity)
		key, err2 := base64.StdEncoding.DecodeString(p.Key)
		if err1 != nil || err2 != nil || len(key) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("read pinned key %s: not a base64 Ed25519 key", filepath.Join(dir, pinnedKeyFile))
		}
		if bytes.Equal(from, identity) {
			t.key = key
		}
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("read pinned key: %w", err)
	}
	data, err = os.ReadFile(filepath.Join(dir, revisionsFile))
	switch {
	case err == nil:
		var r revisionsDoc
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("read active revisions: %w", err)
		}
		if r.Revisions != nil {
			t.revisions = r.Revisions
		}
	case !os.IsNotExist(err):
		return nil, fmt.Errorf("read active revisions: %w", err)
	}
	return t, nil
}

// PinnedKey is the control-plane key manifests must be signed by now.
func (a *Activator) PinnedKey() ed25519.PublicKey {
	a.trust.mu.Lock()
	defer a.trust.mu.Unlock()
	return a.trust.key
}

// authenticate checks m as a whole before anything of it is used: its
// signed header (following a key rotation it announces, and pinning the new
// key), then that no domain's revision goes below the active one without a
// signed rollback. A refusal is a manifest error (see manifest.IsRefusal);
// failing to persist a new pin is not.
func (a *Activator) authenticate(m manifest.Manifest) error {
	t := a.trust
	t.mu.Lock()
	defer t.mu.Unlock()
	signer, err := m.VerifyHeader(t.key, a.o.EdgeID)
	if err != nil {
		return err
	}
	next := make(map[string]int64, len(m.Entries))
	for _, e := range m.Entries {
		if cur, ok := t.revisions[e.Domain]; ok && e.Revision < cur && !e.Rollback {
			return fmt.Errorf("%w: %s revision %d, active %d", manifest.ErrRevision, e.Domain, e.Revision, cur)
		}
		next[e.Domain] = e.Revision
	}
	if !signer.Equal(t.key) {
		doc, _ := json.Marshal(pinnedKey{
			Identity: base64.StdEncoding.EncodeToString(t.identity),
			Key:      base64.StdEncoding.EncodeToString(signer),
		})
		if err := atomicfile.WriteFile(filepath.Join(t.dir, pinnedKeyFile), append(doc, '\n'), 0o644); err != nil {
			return fmt.Errorf("pin rotated control-plane key: %w", err)
		}
		a.log.Warn("control-plane signing key rotated; pinned the new key",
			zap.String("from", base64.StdEncoding.EncodeToString(t.key)), zap.String("to", base64.StdEncoding.EncodeToString(signer)),
			zap.Int64("sequence", m.Sequence))
		t.key = signer
	}
	t.pending, t.pendingSeq = next, m.Sequence
	return nil
}

// commitRevisions makes the revisions of sequence seq, authenticated
// earlier, the floor for later manifests. It runs before the sequence is
// recorded active: a crash between the two re-applies seq, whose
// revisions equal the floor.
func (a *Activator) commitRevisions(seq int64) error {
	t := a.trust
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil || t.pendingSeq != seq {
		return errors.New("activation: no authenticated manifest for this sequence")
	}
	doc, _ := json.Marshal(revisionsDoc{Sequence: seq, Revisions: t.pending})
	if err := atomicfile.WriteFile(filepath.Join(t.dir, revisionsFile), append(doc, '\n'), 0o644); err != nil {
		return fmt.Errorf("record active revisions of %d: %w", seq, err)
	}
	t.revisions, t.pending = t.pending, nil
	return nil
}

// refuseManifest refuses an authenticated manifest and remembers it by its
// header signature, so that it is not verified again while it is served.
func (a *Activator) refuseManifest(m manifest.Manifest, why error) error {
	if err := a.refuse(m.Sequence, why); err != nil {
		return err
	}
	a.trust.mu.Lock()
	a.trust.refusedSig = m.HeaderSignature
	a.trust.mu.Unlock()
	return nil
}

// alreadyRefused tells whether m, authenticated, is the manifest refused
// last.
func (a *Activator) alreadyRefused(m manifest.Manifest) bool {
	a.trust.mu.Lock()
	defer a.trust.mu.Unlock()
	return m.HeaderSignature != "" && a.trust.refusedSig == m.HeaderSignature
}

// ackSequence is the sequence a refusal is acknowledged under: 0 (nothing
// recorded) for one outside 1…2^53−1, which no control API takes.
func ackSequence(seq int64) int64 {
	if seq < 1 || seq > manifest.MaxSequence {
		return 0
	}
	return seq
}
