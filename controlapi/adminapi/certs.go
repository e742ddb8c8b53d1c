package adminapi

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// PathCertificates is the HTTPS certificates': GET lists them, and
// PathCertificates/{name} is one's (PUT uploads, GET shows, DELETE
// removes).
const PathCertificates = "/v1/certificates"

// CertificateRequest uploads a certificate (PUT PathCertificates/{name}).
type CertificateRequest struct {
	// Chain is the PEM chain, leaf first, each certificate followed by
	// its issuer.
	Chain string `json:"chain"`
	// Key is the leaf's PEM private key: stored encrypted, never shown.
	Key string `json:"key"`
	// Replace replaces a certificate of that name (and republishes the
	// domains that use it); without it an existing name is refused.
	Replace bool `json:"replace,omitempty"`
}

// CertificateView is what may be shown of a certificate: never its key.
type CertificateView struct {
	Name        string    `json:"name"`
	Fingerprint string    `json:"fingerprint"`
	Names       []string  `json:"names"`
	Issuer      string    `json:"issuer"`
	KeyType     string    `json:"key_type"`
	NotBefore   time.Time `json:"not_before"`
	NotAfter    time.Time `json:"not_after"`
	UpdatedAt   time.Time `json:"updated_at"`
	// UsedBy are the domains whose current revision names it.
	UsedBy []string `json:"used_by,omitempty"`
	// Republished are the domains a replacement published again, each
	// with its new revision (PUT with replace only).
	Republished map[string]int64 `json:"republished,omitempty"`
	// Failed are the domains a replacement could not republish, each
	// with why (they keep their revision).
	Failed map[string]string `json:"failed,omitempty"`
}

// PutCertificate uploads a certificate under name.
func (c *Client) PutCertificate(ctx context.Context, name string, r CertificateRequest) (CertificateView, error) {
	var out CertificateView
	err := c.do(ctx, http.MethodPut, PathCertificates+"/"+url.PathEscape(name), r, &out)
	return out, err
}

// Certificates lists the certificates.
func (c *Client) Certificates(ctx context.Context) ([]CertificateView, error) {
	var out []CertificateView
	err := c.do(ctx, http.MethodGet, PathCertificates, nil, &out)
	return out, err
}

// Certificate shows one certificate.
func (c *Client) Certificate(ctx context.Context, name string) (CertificateView, error) {
	var out CertificateView
	err := c.do(ctx, http.MethodGet, PathCertificates+"/"+url.PathEscape(name), nil, &out)
	return out, err
}

// DeleteCertificate removes a certificate no domain uses.
func (c *Client) DeleteCertificate(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, PathCertificates+"/"+url.PathEscape(name), nil, nil)
}
