package controlapi

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"cellvisor/controlapi/acmeissue"
	"cellvisor/controlapi/pki"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
	"cellvisor/internal/clock"
)

// ACMEOptions turn on automatic certificates for the domains whose
// document asks for them ("tls": {"acme": true}); docs/tls.md.
type ACMEOptions struct {
	// DirectoryURL is the CA's ACME directory (https). Required.
	DirectoryURL string
	// Email is the account's contact, or empty.
	Email string
	// Roots verify the directory's TLS certificate, or nil for the
	// system's roots.
	Roots *x509.CertPool
	// Certificates stores what is issued as the domain's certificate;
	// nil: the server's own store (Server.PutACME).
	Certificates ACMECertificates
	// ApplyTimeout bounds how long an order waits for the domain's cells
	// to apply the revision carrying its challenges; zero means 5 minutes.
	ApplyTimeout time.Duration
	// Clock times the renewals, or nil for the real clock.
	Clock clock.Clock
}

// ACMECertificates stores an issued certificate as a domain's: its key
// encrypted at rest, the domain republished with the new chain (the
// certificate store's job).
type ACMECertificates interface {
	PutACME(ctx context.Context, domain string, chainPEM, keyPEM []byte) error
}

// ACMEConfig checks the ACME settings of a configuration and reads the CA
// file: nil when directory is empty (ACME off). The options it returns
// still need their Certificates.
func ACMEConfig(directory, email, caFile string) (*ACMEOptions, error) {
	if directory == "" {
		if email != "" || caFile != "" {
			return nil, errors.New("acme email and CA file need an acme directory URL")
		}
		return nil, nil
	}
	o := &ACMEOptions{DirectoryURL: directory, Email: email}
	// The same checks as the issuer's, at start rather than at the first
	// order.
	if _, err := acmeissue.New(acmeissue.Options{DirectoryURL: directory, Email: email, Keys: acmeKeys{}, Challenges: &acmeChallenges{}}); err != nil {
		return nil, err
	}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("acme CA file: %w", err)
		}
		o.Roots = x509.NewCertPool()
		if !o.Roots.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("acme CA file %s: no PEM certificate in it", caFile)
		}
	}
	return o, nil
}

// acmeAccountSetting holds the ACME account key, sealed with the seal key.
const acmeAccountSetting = "acme-account-key"

// ACMEStatus returns each ACME domain's renewal state (nil when ACME is
// off).
func (s *Server) ACMEStatus() []acmeissue.State {
	if s.acme == nil {
		return nil
	}
	return s.acme.Status()
}

// kickACME has the ACME scheduler look at the domains now (one was
// published).
func (s *Server) kickACME() {
	if s.acme != nil {
		s.acme.Kick()
	}
}

// newACME builds the scheduler of o.ACME.
func (s *Server) newACME(o *ACMEOptions) (*acmeissue.Scheduler, error) {
	if o.Certificates == nil {
		o.Certificates = s // the server's own certificate store
	}
	if o.ApplyTimeout <= 0 {
		o.ApplyTimeout = 5 * time.Minute
	}
	is, err := acmeissue.New(acmeissue.Options{
		DirectoryURL: o.DirectoryURL, Email: o.Email, Roots: o.Roots,
		Keys:       acmeKeys{s},
		Challenges: &acmeChallenges{s: s, timeout: o.ApplyTimeout},
		Logger:     s.log,
	})
	if err != nil {
		return nil, err
	}
	src := &acmeSource{s: s, seen: map[string]acmeSeen{}}
	lease := &acmeLease{st: s.st, holder: rand.Text(), ttl: acmeLeaseTTL, now: s.o.Now}
	return acmeissue.NewScheduler(acmeissue.SchedulerOptions{
		Source: src, Sink: acmeSink{o.Certificates}, Obtainer: is, Clock: o.Clock, Logger: s.log, Leader: lease.lead,
	})
}

// acmeLeaseSetting holds the ACME lease: which replica orders.
const acmeLeaseSetting = "acme-lease"

// acmeLeaseTTL is how long the ACME lease lasts unless renewed. The
// holder renews it before every step and every order (an order takes at
// most 10 minutes, a step starts at least every minute), so a replica takes
// over within this of the holder's end.
const acmeLeaseTTL = 15 * time.Minute

// acmeLease has one replica of several sharing a database order
// certificates, so that two do not order the same domain: a lease in the
// store's settings, taken and renewed by compare-and-swap.
type acmeLease struct {
	st     *store.Store
	holder string
	ttl    time.Duration
	now    func() time.Time
}

type acmeLeaseValue struct {
	Holder  string `json:"holder"`
	Expires int64  `json:"expires_ms"`
}

// lead takes or renews the lease, and reports whether this replica holds
// it.
func (l *acmeLease) lead(ctx context.Context) (bool, error) {
	now := l.now()
	mine, err := json.Marshal(acmeLeaseValue{Holder: l.holder, Expires: now.Add(l.ttl).UnixMilli()})
	if err != nil {
		return false, err
	}
	cur, err := l.st.InitSetting(ctx, acmeLeaseSetting, string(mine))
	if err != nil || cur == string(mine) {
		return err == nil, err
	}
	var v acmeLeaseValue
	if json.Unmarshal([]byte(cur), &v) == nil && v.Holder != l.holder && now.UnixMilli() < v.Expires {
		return false, nil // another replica's, still running
	}
	return l.st.SwapSetting(ctx, acmeLeaseSetting, cur, string(mine))
}

// acmeKeys keeps the account key in the store's settings, sealed like the
// signing key; the first replica to store one wins.
type acmeKeys struct{ s *Server }

func (k acmeKeys) AccountKey(ctx context.Context) ([]byte, error) {
	v, err := k.s.st.Setting(ctx, acmeAccountSetting)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return k.open(v)
}

func (k acmeKeys) PutAccountKeyIfAbsent(ctx context.Context, key []byte) ([]byte, error) {
	b, _ := pem.Decode(key)
	if b == nil {
		return nil, errors.New("acme account key: not PEM")
	}
	sealed, err := pki.Seal(k.s.o.SealKey, acmeAccountSetting, b.Bytes)
	if err != nil {
		return nil, err
	}
	v, err := k.s.st.InitSetting(ctx, acmeAccountSetting, sealed)
	if err != nil {
		return nil, err
	}
	return k.open(v)
}

func (k acmeKeys) open(sealed string) ([]byte, error) {
	der, err := pki.Open(k.s.o.SealKey, acmeAccountSetting, sealed)
	if err != nil {
		return nil, fmt.Errorf("acme account key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

type acmeSink struct{ c ACMECertificates }

func (a acmeSink) Put(ctx context.Context, name string, c *acmeissue.Certificate) error {
	return a.c.PutACME(ctx, name, c.ChainPEM, c.KeyPEM)
}

// acmeSource lists the ACME domains from their current revisions, reading
// an artifact again only when the revision changed.
type acmeSource struct {
	s *Server

	mu   sync.Mutex // guards seen
	seen map[string]acmeSeen
}

// acmeSeen is what a domain's current revision (by its digest) says.
type acmeSeen struct {
	sha string
	dom *acmeissue.Domain // nil: not an ACME domain
}

func (a *acmeSource) ACMEDomains(ctx context.Context) ([]acmeissue.Domain, error) {
	ds, err := a.s.st.Domains(ctx)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	next := make(map[string]acmeSeen, len(ds))
	var out []acmeissue.Domain
	for _, d := range ds {
		if d.Deleted {
			continue
		}
		seen, ok := a.seen[d.Name]
		if !ok || seen.sha != d.SHA256 {
			if seen, err = a.read(ctx, d); err != nil {
				return nil, err
			}
		}
		next[d.Name] = seen
		if seen.dom != nil {
			out = append(out, *seen.dom)
		}
	}
	a.seen = next
	return out, nil
}

func (a *acmeSource) read(ctx context.Context, d store.Domain) (acmeSeen, error) {
	_, data, err := a.s.st.Revision(ctx, d.Name, d.Revision)
	if err != nil {
		return acmeSeen{}, err
	}
	seen := acmeSeen{sha: d.SHA256}
	doc, err := domain.Decode(data)
	if err != nil || doc.TLS == nil || !doc.TLS.ACME {
		return seen, nil // a revision that no longer decodes is not ours to certify
	}
	ad := &acmeissue.Domain{Name: d.Name, Hostnames: doc.Hostnames}
	if b, _ := pem.Decode([]byte(doc.TLS.Chain)); b != nil {
		if leaf, err := x509.ParseCertificate(b.Bytes); err == nil {
			ad.NotBefore, ad.NotAfter, ad.Covered = leaf.NotBefore, leaf.NotAfter, leaf.DNSNames
		}
	}
	seen.dom = ad
	return seen, nil
}

// acmeChallenges publishes the challenges to the domain's cells through
// the signed manifest: a new revision of the domain carrying them, and
// waits until every cell serving the domain has applied it.
type acmeChallenges struct {
	s       *Server
	timeout time.Duration
}

// errStale is a publish whose base revision is no longer the newest.
var errStale = errors.New("the domain was published meanwhile")

func (a *acmeChallenges) Present(ctx context.Context, name string, chs []domain.ACMEChallenge) error {
	rev, err := a.republish(ctx, name, chs)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "the domain's cells"
	for {
		waiting, refused, err := a.s.st.DomainApplied(wctx, name, rev)
		switch {
		case err != nil && wctx.Err() == nil:
			return fmt.Errorf("revision %d of %s: %w", rev, name, err)
		case refused != "":
			return fmt.Errorf("revision %d of %s: %s", rev, name, refused)
		case err == nil && waiting == "":
			return nil
		case waiting != "":
			last = waiting
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("revision %d of %s not applied in %v: waiting for %s", rev, name, a.timeout, last)
		case <-tick.C:
		}
	}
}

func (a *acmeChallenges) CleanUp(ctx context.Context, name string) error {
	_, err := a.republish(ctx, name, nil)
	return err
}

// republish publishes the domain's current document again with chs as its
// pending challenges (nil: none), and returns the new revision. It does
// nothing when the document already carries exactly those. An operator's
// publish that lands first wins: this one is retried on it.
func (a *acmeChallenges) republish(ctx context.Context, name string, chs []domain.ACMEChallenge) (int64, error) {
	for try := 0; ; try++ {
		rev, err := a.republishOnce(ctx, name, chs)
		if !errors.Is(err, errStale) || try == 2 {
			return rev, err
		}
	}
}

func (a *acmeChallenges) republishOnce(ctx context.Context, name string, chs []domain.ACMEChallenge) (int64, error) {
	cur, err := a.s.st.Domain(ctx, name)
	if err != nil {
		return 0, err
	}
	if cur.Deleted {
		return 0, fmt.Errorf("domain %s was deleted", name)
	}
	_, data, err := a.s.st.Revision(ctx, name, cur.Revision)
	if err != nil {
		return 0, err
	}
	doc, err := domain.Decode(data)
	if err != nil {
		return 0, fmt.Errorf("revision %d of %s: %w", cur.Revision, name, err)
	}
	if doc.TLS == nil || !doc.TLS.ACME {
		return 0, fmt.Errorf("domain %s no longer asks for acme", name)
	}
	if len(chs) == 0 && len(doc.TLS.Challenges) == 0 {
		return cur.Revision, nil
	}
	// The revision after the newest one ever published (a rollback leaves
	// newer ones behind): any other means a publish landed meanwhile.
	top := cur.Revision
	for {
		if _, _, err := a.s.st.Revision(ctx, name, top+1); errors.Is(err, store.ErrNotFound) {
			break
		} else if err != nil {
			return 0, err
		}
		top++
	}
	doc.TLS.Challenges = chs
	config, err := json.Marshal(doc)
	if err != nil {
		return 0, err
	}
	p, err := a.s.st.PublishDomain(ctx, name, cur.Pool, doc.Hostnames, func(rev int64) ([]byte, error) {
		if rev != top+1 {
			return nil, errStale
		}
		_, data, err := domainArtifact(name, cur.Pool, config, rev)
		return data, err
	})
	if err != nil {
		return 0, err
	}
	a.s.refresh(ctx)
	a.s.log.Info("domain published with acme challenges", zap.String("domain", name), zap.Int64("revision", p.Domain.Revision),
		zap.Int("challenges", len(chs)), zap.Int("edges", p.Pending))
	return p.Domain.Revision, nil
}
