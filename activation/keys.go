package activation

import (
	"crypto/tls"
	"errors"
	"fmt"

	"cellvisor/domain"
	"cellvisor/manifest"
	"cellvisor/tlsseal"
)

// errNoEncryptionKey: an entry carries a sealed key and this agent has no
// encryption key to open it with.
var errNoEncryptionKey = errors.New("no encryption key on this edge")

// openKey opens the certificate key sealed in an entry to this edge (nil
// when it carries none) and checks that it is the key of the chain's leaf
// the artifact carries. A seal for another edge, domain or certificate, a
// tampered one, one for an unknown encryption key, or a key that is not
// the leaf's refuses the manifest (manifest.ErrInvalid, with the reason).
// The key is never logged: only the pool runtime holds it.
func (a *Activator) openKey(e manifest.Entry, d *domain.Domain) ([]byte, error) {
	if e.Key == nil {
		return nil, nil
	}
	if d.TLS == nil || d.TLS.Chain == "" {
		return nil, fmt.Errorf("%w: entry %s: a sealed key and no certificate chain", manifest.ErrInvalid, e.Domain)
	}
	if a.o.EncryptionKey == nil {
		return nil, fmt.Errorf("%w: entry %s: sealed key: %w: %w", manifest.ErrInvalid, e.Domain, tlsseal.ErrUnknownKey, errNoEncryptionKey)
	}
	key, err := tlsseal.Open(a.o.EncryptionKey, a.o.EdgeID, e.Domain, d.TLS.Fingerprint, *e.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: entry %s: sealed key: %w", manifest.ErrInvalid, e.Domain, err)
	}
	if _, err := tls.X509KeyPair([]byte(d.TLS.Chain), key); err != nil {
		clear(key)
		return nil, fmt.Errorf("%w: entry %s: the opened key is not the certificate's (leaf %s)", manifest.ErrInvalid, e.Domain, d.TLS.Fingerprint)
	}
	return key, nil
}
