package activation

import (
	"fmt"
	"os"
	"sync"

	"cellvisor/domain"
	"cellvisor/runtime"
)

// docSpill keeps the canonical documents of one activation's verified
// domains on disk, in an unlinked file under the state directory, instead of
// in memory: a manifest or recovery snapshot near its 96 MiB bound would
// otherwise hold all of it in the agent's heap (the agent is limited to
// 128 MiB) while the pool runtime JSON is written. The pools read each
// document back as they write it. Nothing stays on disk after a crash: the
// file has no name.
type docSpill struct {
	f *os.File

	mu  sync.Mutex // guards the following fields
	end int64
	at  map[string][2]int64 // domain name → offset, length
}

func newDocSpill(dir string) (*docSpill, error) {
	f, err := os.CreateTemp(dir, ".activation-docs-")
	if err != nil {
		return nil, fmt.Errorf("spill verified documents: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("spill verified documents: %w", err)
	}
	return &docSpill{f: f, at: map[string][2]int64{}}, nil
}

// put stores d's canonical document and returns d without it (its names
// only), so that memory holds no configuration.
func (s *docSpill) put(d domain.Domain) (domain.Domain, error) {
	doc := d.Canonical()
	s.mu.Lock()
	off := s.end
	s.end += int64(len(doc))
	s.at[d.Domain] = [2]int64{off, int64(len(doc))}
	s.mu.Unlock()
	if _, err := s.f.WriteAt(doc, off); err != nil {
		return domain.Domain{}, fmt.Errorf("spill the document of %s: %w", d.Domain, err)
	}
	kept := domain.Domain{Domain: d.Domain, Pool: d.Pool, Revision: d.Revision, Hostnames: d.Hostnames, Cache: d.Cache,
		Origins: checkedOrigins(d.Origins)}
	if d.HasCertificate() {
		// Its certificate by fingerprint alone (the release's keys file
		// pairs the key with it), its expiry noted for the cell's status.
		runtime.NoteCertificate(d.TLS.Fingerprint, d.TLS.Chain)
		kept.TLS = &domain.TLS{Fingerprint: d.TLS.Fingerprint}
	}
	return kept, nil
}

// doc reads d's document back: runtime.PoolRuntime.Docs.
func (s *docSpill) doc(d *domain.Domain) ([]byte, error) {
	s.mu.Lock()
	at, ok := s.at[d.Domain]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no spilled document for %s", d.Domain)
	}
	buf := make([]byte, at[1])
	if _, err := s.f.ReadAt(buf, at[0]); err != nil {
		return nil, err
	}
	return buf, nil
}

// attach makes pools read their documents from the spill.
func (s *docSpill) attach(pools map[string]*runtime.PoolRuntime) {
	for _, p := range pools {
		p.Docs = s.doc
	}
}

// close frees the file (and its disk space): after the activation that used
// it, whatever its outcome.
func (s *docSpill) close() {
	if s != nil {
		s.f.Close()
	}
}

// checkedOrigins are the origins with an active health check (the release
// renders what their checks need), or nil.
func checkedOrigins(os []domain.Origin) []domain.Origin {
	var out []domain.Origin
	for _, o := range os {
		if o.HealthCheck != nil {
			out = append(out, o)
		}
	}
	return out
}
