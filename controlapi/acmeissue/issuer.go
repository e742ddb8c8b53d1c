// Package acmeissue obtains and renews the certificates of the domains
// that ask for them ("tls": {"acme": true}) from an ACME CA (RFC 8555),
// with golang.org/x/crypto/acme as the protocol client: an Issuer runs one
// order (account, HTTP-01 challenges handed to the caller to publish,
// finalize, chain), a Scheduler decides when each domain is due and backs
// off on failure. Delivering the challenges to the cells and storing what
// was issued are the caller's, behind the Challenges and Sink interfaces.
// Only controlapi imports it.
package acmeissue

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/crypto/acme"

	"cellvisor/domain"
)

// Challenges delivers HTTP-01 challenges to the cells that serve a domain.
type Challenges interface {
	// Present has the cells serving domain answer each challenge at
	// /.well-known/acme-challenge/<token> with its key authorization,
	// and returns once they do (or with why not).
	Present(ctx context.Context, domain string, challenges []domain.ACMEChallenge) error
	// CleanUp withdraws the challenges Present published.
	CleanUp(ctx context.Context, domain string) error
}

// KeyStore keeps the ACME account key. The control API keeps it encrypted
// at rest; replicas share it.
type KeyStore interface {
	// AccountKey returns the stored key (PKCS#8 PEM), or nil and no error
	// when none is stored yet.
	AccountKey(ctx context.Context) ([]byte, error)
	// PutAccountKeyIfAbsent stores key unless a key is already stored,
	// and returns the key stored after the call: a replica that lost the
	// race uses the winner's.
	PutAccountKeyIfAbsent(ctx context.Context, key []byte) ([]byte, error)
}

// Certificate is what an order gives.
type Certificate struct {
	// ChainPEM is the chain, leaf first, as the CA sent it.
	ChainPEM []byte
	// KeyPEM is the leaf's private key (PKCS#8 PEM): never log it.
	KeyPEM []byte
	// NotBefore and NotAfter are the leaf's validity.
	NotBefore, NotAfter time.Time
}

// Options configure an Issuer.
type Options struct {
	// DirectoryURL is the CA's ACME directory. Required, https.
	DirectoryURL string
	// Email is the account's contact, or empty for none.
	Email string
	// Roots verifies the directory's TLS certificate, or nil for the
	// system's roots (a test CA such as Pebble needs its own).
	Roots *x509.CertPool
	// Keys keeps the account key. Required.
	Keys KeyStore
	// Challenges publishes the HTTP-01 challenges. Required.
	Challenges Challenges
	// Logger logs each order's steps, or nil for none.
	Logger *zap.Logger
	// UserAgent is prepended to the client's User-Agent, or empty.
	UserAgent string
}

// Issuer obtains certificates from one ACME CA with one account.
type Issuer struct {
	o   Options
	log *zap.Logger

	mu     sync.Mutex   // guards the following fields
	client *acme.Client // nil until the account is registered
}

// New checks o and returns an Issuer; it reaches the CA only when asked.
func New(o Options) (*Issuer, error) {
	if !strings.HasPrefix(o.DirectoryURL, "https://") {
		return nil, fmt.Errorf("acme directory URL %q: must be https://", o.DirectoryURL)
	}
	if o.Email != "" && (strings.ContainsAny(o.Email, " \t\r\n,") || !strings.Contains(o.Email, "@")) {
		return nil, fmt.Errorf("acme email %q: must be one address", o.Email)
	}
	if o.Keys == nil || o.Challenges == nil {
		return nil, errors.New("acme issuer: Keys and Challenges are required")
	}
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Issuer{o: o, log: log.Named("acme")}, nil
}

// account returns a client registered with the CA, creating and storing
// the account key the first time.
func (is *Issuer) account(ctx context.Context) (*acme.Client, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.client != nil {
		return is.client, nil
	}
	key, err := is.accountKey(ctx)
	if err != nil {
		return nil, err
	}
	c := &acme.Client{
		Key:          key,
		DirectoryURL: is.o.DirectoryURL,
		UserAgent:    strings.TrimSpace("cellvisor-control " + is.o.UserAgent),
		HTTPClient: &http.Client{
			Timeout: time.Minute,
			Transport: &http.Transport{
				Proxy:               http.ProxyFromEnvironment,
				TLSClientConfig:     &tls.Config{RootCAs: is.o.Roots, MinVersion: tls.VersionTLS12},
				TLSHandshakeTimeout: 10 * time.Second,
			},
		},
	}
	acct := &acme.Account{}
	if is.o.Email != "" {
		acct.Contact = []string{"mailto:" + is.o.Email}
	}
	if _, err := c.Register(ctx, acct, acme.AcceptTOS); err != nil && !errors.Is(err, acme.ErrAccountAlreadyExists) {
		return nil, fmt.Errorf("register acme account: %w", problemErr("register", "", err))
	}
	is.client = c
	is.log.Info("acme account ready", zap.String("directory", is.o.DirectoryURL))
	return c, nil
}

func (is *Issuer) accountKey(ctx context.Context) (crypto.Signer, error) {
	b, err := is.o.Keys.AccountKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("read acme account key: %w", err)
	}
	if b == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate acme account key: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("encode acme account key: %w", err)
		}
		if b, err = is.o.Keys.PutAccountKeyIfAbsent(ctx, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})); err != nil {
			return nil, fmt.Errorf("store acme account key: %w", err)
		}
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("acme account key: stored key is not a PKCS#8 PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("acme account key: %w", err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("acme account key: an ECDSA key is needed, stored is %T", k)
	}
	return ek, nil
}

// cleanupTimeout bounds withdrawing the challenges after an order, which
// runs even when the order's context has ended.
const cleanupTimeout = 30 * time.Second

// Obtain runs one order for the hostnames of domain name: each pending
// authorization's HTTP-01 challenge is presented through Challenges (all of
// them at once: one publish), accepted and awaited; then the order is
// finalized with a CSR of a new ECDSA P-256 key and the chain fetched. An
// error from the CA is an *Error carrying its problem.
func (is *Issuer) Obtain(ctx context.Context, name string, hostnames []string) (*Certificate, error) {
	if len(hostnames) == 0 {
		return nil, fmt.Errorf("acme order for %s: no hostnames", name)
	}
	log := is.log.With(zap.String("domain", name), zap.Strings("hostnames", hostnames))
	c, err := is.account(ctx)
	if err != nil {
		return nil, err
	}
	order, err := c.AuthorizeOrder(ctx, acme.DomainIDs(hostnames...))
	if err != nil {
		return nil, fmt.Errorf("acme order for %s: %w", name, problemErr("new order", "", err))
	}
	var todo []pendingAuthz
	for _, u := range order.AuthzURLs {
		z, err := c.GetAuthorization(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("acme order for %s: %w", name, problemErr("authorization", "", err))
		}
		if z.Status == acme.StatusValid {
			continue
		}
		i := slices.IndexFunc(z.Challenges, func(ch *acme.Challenge) bool { return ch.Type == "http-01" })
		if i < 0 {
			return nil, fmt.Errorf("acme order for %s: %w", name, &Error{Step: "authorization", Hostname: z.Identifier.Value,
				Problems: []Problem{{Detail: "the CA offers no http-01 challenge"}}})
		}
		ka, err := c.HTTP01ChallengeResponse(z.Challenges[i].Token)
		if err != nil {
			return nil, fmt.Errorf("acme order for %s: key authorization: %w", name, err)
		}
		todo = append(todo, pendingAuthz{host: z.Identifier.Value, chal: z.Challenges[i], url: z.URI, keyAuth: ka})
	}
	if len(todo) > 0 {
		if err := is.validate(ctx, log, c, name, todo); err != nil {
			return nil, fmt.Errorf("acme order for %s: %w", name, err)
		}
	}
	// The order as created keeps its finalize URL (a polled order may
	// come back without it).
	if _, err := c.WaitOrder(ctx, order.URI); err != nil {
		return nil, fmt.Errorf("acme order for %s: %w", name, problemErr("order", "", err))
	}
	cert, err := finalize(ctx, c, order, hostnames)
	if err != nil {
		return nil, fmt.Errorf("acme order for %s: %w", name, err)
	}
	log.Info("acme certificate issued", zap.Time("not_after", cert.NotAfter))
	return cert, nil
}

// pendingAuthz is an authorization to validate: its hostname, its
// HTTP-01 challenge and that challenge's key authorization.
type pendingAuthz struct {
	host, url, keyAuth string
	chal               *acme.Challenge
}

// validate presents the challenges, tells the CA to check each and waits
// for its verdicts; the challenges are withdrawn whatever happens.
func (is *Issuer) validate(ctx context.Context, log *zap.Logger, c *acme.Client, name string, todo []pendingAuthz) error {
	present := make([]domain.ACMEChallenge, len(todo))
	for i, p := range todo {
		present[i] = domain.ACMEChallenge{Token: p.chal.Token, KeyAuthorization: p.keyAuth}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := is.o.Challenges.CleanUp(cctx, name); err != nil {
			log.Warn("acme challenges not withdrawn", zap.Error(err))
		}
	}()
	log.Info("acme challenges presenting", zap.Int("challenges", len(present)))
	if err := is.o.Challenges.Present(ctx, name, present); err != nil {
		return fmt.Errorf("present challenges: %w", err)
	}
	for _, p := range todo {
		if _, err := c.Accept(ctx, p.chal); err != nil {
			return problemErr("accept challenge", p.host, err)
		}
	}
	for _, p := range todo {
		if _, err := c.WaitAuthorization(ctx, p.url); err != nil {
			return problemErr("validate", p.host, err)
		}
	}
	return nil
}

// finalize sends the CSR of a new key and returns the chain with the key.
func finalize(ctx context.Context, c *acme.Client, order *acme.Order, hostnames []string) (*Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate certificate key: %w", err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: hostnames[0]},
		DNSNames: hostnames,
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create csr: %w", err)
	}
	ders, _, err := c.CreateCertFromOrder(ctx, order, csr, true)
	if err != nil {
		return nil, problemErr("finalize", "", err)
	}
	if len(ders) == 0 {
		return nil, errors.New("finalize: the CA sent no certificate")
	}
	leaf, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return nil, fmt.Errorf("finalize: leaf: %w", err)
	}
	if !leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()) {
		return nil, errors.New("finalize: the CA's leaf is not for the key sent")
	}
	for _, h := range hostnames {
		if err := leaf.VerifyHostname(h); err != nil {
			return nil, fmt.Errorf("finalize: the CA's leaf does not cover %s", h)
		}
	}
	var chain []byte
	for _, der := range ders {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode certificate key: %w", err)
	}
	return &Certificate{
		ChainPEM:  chain,
		KeyPEM:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		NotBefore: leaf.NotBefore,
		NotAfter:  leaf.NotAfter,
	}, nil
}
