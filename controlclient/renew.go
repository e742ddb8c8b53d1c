package controlclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/edgeapi"
	"cellvisor/internal/atomicfile"
)

// Renewal files, beside the key and certificate: a renewal that did not
// finish keeps its key and CSR (0600), so that a retry is an exact retry
// and gets the same certificate, then the certificate it got, until the
// key and certificate files are both switched to the new pair.
const (
	renewKey  = "renew-key.pem"
	renewCSR  = "renew-csr.pem"
	renewCert = "renew-cert.pem"
)

// RenewAt is when to renew a certificate valid from notBefore to notAfter:
// at r (in [0, 1), drawn uniformly) of the way from 70 % to 90 % of its
// lifetime, as kubelet rotates its client certificate, so that a fleet
// enrolled together does not renew together.
func RenewAt(notBefore, notAfter time.Time, r float64) time.Time {
	life := notAfter.Sub(notBefore)
	return notBefore.Add(time.Duration(float64(life) * (0.7 + 0.2*r)))
}

// retryDelay is the wait after the n-th failed renewal in a row (from 0):
// doubling from lo, capped at hi, then jittered by ±50 % with r in [0, 1).
func retryDelay(n int, lo, hi time.Duration, r float64) time.Duration {
	d := lo
	for i := 0; i < n && d < hi; i++ {
		d *= 2
	}
	return time.Duration(float64(min(d, hi)) * (0.5 + r))
}

// RenewOptions say how to renew.
type RenewOptions struct {
	// RetryMin and RetryMax bound the wait between failed attempts, which
	// doubles from RetryMin; zero means 10s and 30m (and a RetryMax under
	// RetryMin means RetryMin).
	RetryMin, RetryMax time.Duration
	// Rand draws in [0, 1) for the renewal time and jitter; nil means
	// math/rand/v2.
	Rand func() float64
}

// RenewalStatus is where renewal stands, for the agent's status.
type RenewalStatus struct {
	// CertExpires is when the certificate in use expires.
	CertExpires time.Time
	// Next is when the next renewal attempt is due; zero while none is
	// scheduled (renewal not running).
	Next time.Time
	// LastRenewed is when the certificate was last renewed by this process.
	LastRenewed time.Time
	// LastError is why the last attempt failed, empty once one succeeds.
	LastError string
}

// renewState is the client's renewal state, under Client.mu.
type renewState struct {
	next    time.Time
	renewed time.Time
	lastErr string
}

// Renewal reports the certificate's expiry and the next renewal.
func (c *Client) Renewal() RenewalStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := RenewalStatus{Next: c.renewal.next, LastRenewed: c.renewal.renewed, LastError: c.renewal.lastErr}
	if c.cert != nil && c.cert.Leaf != nil {
		st.CertExpires = c.cert.Leaf.NotAfter
	}
	return st
}

// RunRenewal keeps the client certificate renewed until ctx ends: it
// finishes a switch a crash interrupted, then renews at RenewAt, retrying
// with backoff, and switches to each new certificate atomically. Each step
// is logged.
func (c *Client) RunRenewal(ctx context.Context, o RenewOptions) {
	if o.RetryMin <= 0 {
		o.RetryMin = 10 * time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 30 * time.Minute
	}
	o.RetryMax = max(o.RetryMax, o.RetryMin)
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	log := c.log.Named("renew")
	if err := c.finishSwitch(log); err != nil {
		log.Error("finish an interrupted certificate switch", zap.Error(err))
	}
	for {
		leaf := c.leaf()
		at := RenewAt(leaf.NotBefore, leaf.NotAfter, o.Rand())
		log.Info("certificate renewal scheduled", zap.String("serial", leaf.SerialNumber.Text(16)),
			zap.Time("expires", leaf.NotAfter), zap.Time("renew_at", at))
		c.setRenewal(at, "")
		if !sleepUntil(ctx, at) {
			return
		}
		for fails := 0; ; fails++ {
			log.Info("renewing the client certificate", zap.Time("expires", leaf.NotAfter), zap.Int("attempt", fails+1))
			serial, err := c.renew(ctx, leaf.Subject.CommonName)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				log.Info("switched to the renewed client certificate", zap.String("serial", serial))
				c.rotateEncryptionKey(ctx, log, o)
				break
			}
			next := time.Now().Add(retryDelay(fails, o.RetryMin, o.RetryMax, o.Rand()))
			if time.Now().After(leaf.NotAfter) {
				err = fmt.Errorf("%w; the certificate expired at %s and the control API refuses it: rotate the edge (cellvisor-control edge rotate) and enroll again with --replace",
					err, leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			log.Warn("certificate renewal failed; retrying", zap.Error(err), zap.Time("retry_at", next),
				zap.Time("expires", leaf.NotAfter), zap.Duration("left", time.Until(leaf.NotAfter).Round(time.Second)))
			c.setRenewal(next, err.Error())
			if !sleepUntil(ctx, next) {
				return
			}
		}
	}
}

func (c *Client) setRenewal(next time.Time, lastErr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewal.next, c.renewal.lastErr = next, lastErr
}

// leaf is the certificate in use.
func (c *Client) leaf() *x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert.Leaf
}

// sleepUntil waits until at, or returns false when ctx ends first. It
// wakes at least hourly to look at the wall clock again, so that a clock
// set forward (or a host that slept) does not postpone a renewal.
func sleepUntil(ctx context.Context, at time.Time) bool {
	for {
		d := time.Until(at)
		if d <= 0 {
			return ctx.Err() == nil
		}
		t := time.NewTimer(min(d, time.Hour))
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// renew asks for a certificate for the pending key (made on the first
// attempt, kept until the switch), keeps what it got, and switches to it.
func (c *Client) renew(ctx context.Context, edgeID string) (string, error) {
	key, csrPEM, err := pending(c.o.Dir, renewKey, renewCSR)
	if err != nil {
		return "", fmt.Errorf("renewal key: %w", err)
	}
	resp, err := c.do(ctx, c.o.Timeout, http.MethodPost, edgeapi.PathRenew, nil, nil, edgeapi.RenewRequest{CSR: string(csrPEM)})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var rr edgeapi.RenewResponse
	dec := json.NewDecoder(io.LimitReader(resp.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rr); err != nil {
		return "", fmt.Errorf("renew: decode answer: %w", err)
	}
	cert, err := checkCert(rr.Certificate, rr.CA, edgeID, key)
	if err != nil {
		return "", fmt.Errorf("renew: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(c.o.Dir, renewCert), []byte(rr.Certificate), 0o600); err != nil {
		return "", fmt.Errorf("renew: keep the new certificate: %w", err)
	}
	if err := c.finishSwitch(c.log.Named("renew")); err != nil {
		return "", err
	}
	return cert.SerialNumber.Text(16), nil
}

// finishSwitch switches to the renewed pair when one is complete: it writes
// the key file, then the certificate file (each atomically; loadPair reads
// the renewed pair while the two do not match), puts the pair in use for
// every new connection, and removes the renewal files. A renewed
// certificate that is damaged, not for the renewal key, or older than the
// one in use (left by an identity enrolled again since) is dropped.
func (c *Client) finishSwitch(log *zap.Logger) error {
	dir := c.o.Dir
	certPEM, err := os.ReadFile(filepath.Join(dir, renewCert))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("renewed certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, renewKey))
	if err != nil {
		// Removed first when a switch is done: its clean-up was interrupted.
		return removeRenewal(dir)
	}
	next, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The key and CSR stay, for an exact retry.
		log.Warn("dropping a renewed certificate that does not match the renewal key", zap.Error(err))
		return os.Remove(filepath.Join(dir, renewCert))
	}
	cur, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	switch {
	case err == nil && bytes.Equal(cur.Leaf.Raw, next.Leaf.Raw):
		// Switched already; only the clean-up was interrupted.
	case err == nil && !next.Leaf.NotBefore.After(cur.Leaf.NotBefore):
		log.Warn("dropping a renewed certificate older than the one in use", zap.String("serial", next.Leaf.SerialNumber.Text(16)))
		return removeRenewal(dir)
	default:
		// The files change under the running client: it keeps the pair in
		// memory until install, which gives the new one new connections.
		c.setSwitching(true)
		defer c.setSwitching(false)
		if err := atomicfile.WriteFile(filepath.Join(dir, KeyFile), keyPEM, 0o600); err != nil {
			return fmt.Errorf("switch to the renewed key: %w", err)
		}
		if err := atomicfile.WriteFile(filepath.Join(dir, CertFile), certPEM, 0o600); err != nil {
			return fmt.Errorf("switch to the renewed certificate: %w", err)
		}
	}
	c.install(&next)
	return removeRenewal(dir)
}

func (c *Client) setSwitching(v bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.switching = v
}

// removeRenewal removes the renewal files, the certificate last: without
// the key beside it, a certificate left by a crash is dropped.
func removeRenewal(dir string) error {
	for _, f := range []string{renewKey, renewCSR, renewCert} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return atomicfile.SyncDir(dir)
}

// install puts a renewed pair in use: new connections, on a new transport,
// present it; requests on the old one's connections finish there, and one
// refused meanwhile is sent again (do).
func (c *Client) install(cert *tls.Certificate) {
	var mod time.Time
	if st, err := os.Stat(filepath.Join(c.o.Dir, CertFile)); err == nil {
		mod = st.ModTime()
	}
	c.mu.Lock()
	old := c.hc
	c.cert, c.certMod = cert, mod
	c.renewal.renewed, c.renewal.lastErr = time.Now(), ""
	if old != nil {
		c.hc, c.hcGen = c.newHTTPClient(), c.hcGen+1
	}
	c.mu.Unlock()
	if old != nil {
		old.CloseIdleConnections()
	}
}

// loadPair loads the key and certificate files or, when they do not match
// (a crash between the two writes of a switch), the renewed pair the
// switch was writing.
func loadPair(dir string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err == nil {
		return cert, nil
	}
	if next, rerr := tls.LoadX509KeyPair(filepath.Join(dir, renewCert), filepath.Join(dir, renewKey)); rerr == nil {
		return next, nil
	}
	return tls.Certificate{}, err
}

// rotateEncryptionKey gives the edge a new encryption key with its new
// certificate (RotateEncryptionKey), retrying with backoff until it is
// registered or ctx ends.
func (c *Client) rotateEncryptionKey(ctx context.Context, log *zap.Logger, o RenewOptions) {
	for fails := 0; ; fails++ {
		err := c.RotateEncryptionKey(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			log.Info("encryption key rotated with the certificate")
			return
		}
		next := time.Now().Add(retryDelay(fails, o.RetryMin, o.RetryMax, o.Rand()))
		log.Warn("encryption key rotation failed; retrying", zap.Error(err), zap.Time("retry_at", next))
		if !sleepUntil(ctx, next) {
			return
		}
	}
}
