package activation

import (
	"crypto/ecdh"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"

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
func (a *Activator) openKey(keys []*ecdh.PrivateKey, e manifest.Entry, d *domain.Domain) ([]byte, error) {
	if e.Key == nil {
		return nil, nil
	}
	if d.TLS == nil || d.TLS.Chain == "" {
		return nil, fmt.Errorf("%w: entry %s: a sealed key and no certificate chain", manifest.ErrInvalid, e.Domain)
	}
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
