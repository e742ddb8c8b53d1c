package activation

import (
	"crypto/ecdh"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"

	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

// errNoEncryptionKey: an entry carries a sealed key and this agent has no
// encryption key to open it with.
var errNoEncryptionKey = errors.New("no encryption key on this edge")

// encryptionKeys reads the edge's encryption keys when an entry of m
// carries a sealed key.
func (a *Activator) encryptionKeys(m manifest.Manifest) ([]*ecdh.PrivateKey, error) {
	if a.o.EncryptionKeys == nil || !slices.ContainsFunc(m.Entries, func(e manifest.Entry) bool { return e.Key != nil }) {
		return nil, nil
	}
	keys, err := a.o.EncryptionKeys()
	if err != nil {
		return nil, fmt.Errorf("read the encryption keys: %w", err)
	}
	return keys, nil
}

// openKey opens the certificate key sealed in an entry to this edge (nil
// when it carries none) with the one of keys it names, and checks that it
// is the key of the chain's leaf the artifact carries. A seal for another
// edge, domain or certificate, a tampered one, one for an unknown
// encryption key, or a key that is not the leaf's refuses the manifest
// (manifest.ErrInvalid, with the reason). The key is never logged: only
// the pool runtime holds it.
func (a *Activator) openKey(keys []*ecdh.PrivateKey, e manifest.Entry, d *domain.Domain, opened *openedKeys) ([]byte, error) {
	if e.Key == nil {
		return nil, nil
	}
	if d.TLS == nil || d.TLS.Chain == "" {
		return nil, fmt.Errorf("%w: entry %s: a sealed key and no certificate chain", manifest.ErrInvalid, e.Domain)
	}
	id := sealID(e, d.TLS.Fingerprint)
	a.openedMu.Lock()
	key, ok := a.opened[id]
	a.openedMu.Unlock()
	if ok {
		opened.put(id, key)
		return key, nil
	}
	key, err := a.openNew(keys, e, d)
	if err == nil {
		opened.put(id, key)
	}
	return key, err
}

// sealID names a seal that opened once: the same blob for the same
// domain and leaf opens to the same key and passes the same checks (the
// HPKE info binds this edge, the domain and the fingerprint).
func sealID(e manifest.Entry, fp string) string {
	return e.Domain + "\x00" + fp + "\x00" + e.Key.KeyID + "\x00" + e.Key.Enc + "\x00" + e.Key.Sealed
}

// openedKeys are the keys a verification opened or took, by seal: kept
// as the Activator's once the verification succeeds.
type openedKeys struct {
	mu   sync.Mutex
	keys map[string][]byte
}

func (o *openedKeys) put(id string, key []byte) {
	o.mu.Lock()
	o.keys[id] = key
	o.mu.Unlock()
}

// keep makes o the keys later verifications take as they are.
func (a *Activator) keep(o *openedKeys) {
	a.openedMu.Lock()
	a.opened = o.keys
	a.openedMu.Unlock()
}

// openNew opens and checks a seal the last verification did not.
func (a *Activator) openNew(keys []*ecdh.PrivateKey, e manifest.Entry, d *domain.Domain) ([]byte, error) {
	a.opens.Add(1)
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: entry %s: sealed key: %w: %w", manifest.ErrInvalid, e.Domain, tlsseal.ErrUnknownKey, errNoEncryptionKey)
	}
	priv := keys[0]
	for _, k := range keys {
		if tlsseal.KeyID(k.PublicKey()) == e.Key.KeyID {
			priv = k
		}
	}
	key, err := tlsseal.Open(priv, a.o.EdgeID, e.Domain, d.TLS.Fingerprint, *e.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: entry %s: sealed key: %w", manifest.ErrInvalid, e.Domain, err)
	}
	if _, err := tls.X509KeyPair([]byte(d.TLS.Chain), key); err != nil {
		clear(key)
		return nil, fmt.Errorf("%w: entry %s: the opened key is not the certificate's (leaf %s)", manifest.ErrInvalid, e.Domain, d.TLS.Fingerprint)
	}
	return key, nil
}
