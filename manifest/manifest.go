// Package manifest owns the signed configuration contract between the
// control plane and an edge: manifest pages and their entries, the canonical
// domain-separated encoding an entry's Ed25519 signature covers, verification
// of artifact bytes (size, SHA-256, signature by the pinned key), strict
// decoding with hard bounds, paging, and reading gzip recovery snapshots with
// hard bounds on download and expansion. It does no I/O of its own beyond the
// readers it is given. Both sides import it; any package may import it.
package manifest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"cellvisor/domain"
)

// Bounds.
const (
	// MaxEntries is the most entries one page may carry.
	MaxEntries = 500
	// MaxArtifactBytes is the largest artifact accepted.
	MaxArtifactBytes = 1 << 20
	// MaxPages bounds one manifest's page walk.
	MaxPages = 1000
	// MaxPageBytes bounds one encoded page.
	MaxPageBytes = 4 << 20
)

// Errors, by kind of refusal.
var (
	ErrInvalid    = errors.New("invalid manifest")
	ErrStale      = errors.New("manifest sequence does not move forward")
	ErrSize       = errors.New("artifact size mismatch")
	ErrDigest     = errors.New("artifact SHA-256 mismatch")
	ErrSignature  = errors.New("artifact signature invalid")
	ErrDuplicate  = errors.New("duplicate domain in manifest")
	ErrTooMany    = errors.New("too many entries in a manifest page")
	ErrSnapshot   = errors.New("invalid recovery snapshot")
	ErrTooLarge   = errors.New("recovery snapshot over its bound")
	ErrRevision   = errors.New("revision goes backwards without a signed rollback")
	signingDomain = []byte("cellvisor/artifact/v1\x00")
)

// Page is one page of an edge's manifest.
type Page struct {
	EdgeID   string  `json:"edge_id"`
	Sequence int64   `json:"sequence"`
	Entries  []Entry `json:"entries"`
	// Next is the cursor of the next page; empty on the last one.
	Next string `json:"next,omitempty"`
	// Header and HeaderSignature authenticate the whole manifest; every
	// page carries the same ones.
	Header          Header `json:"header"`
	HeaderSignature string `json:"header_signature"`
	// Assignments are the edge's signed cell assignments (see
	// Assignments); every page carries the same, or none.
	Assignments *Assignments `json:"assignments,omitempty"`
}

// Entry names one domain revision's artifact and carries its signature.
type Entry struct {
	Domain   string `json:"domain"`
	Pool     string `json:"pool"`
	Revision int64  `json:"revision"`
	Size     int64  `json:"size"`
	// SHA256 is the lowercase hex SHA-256 of the artifact bytes.
	SHA256 string `json:"sha256"`
	// Rollback marks a revision lower than one published before, on an
	// operator's rollback: without it an edge refuses a revision that goes
	// backwards. Signed with the entry.
	Rollback bool `json:"rollback,omitempty"`
	// Cells are the cells of this edge that serve the domain (its active
	// and target cells), sorted; empty means every cell of its pool (a
	// control plane that does not place). Signed with the entry.
	Cells []string `json:"cells,omitempty"`
	// Key is the private key of the domain's certificate (its TLS chain),
	// sealed to this edge's encryption key; nil for a domain without one.
	// Signed with the entry.
	Key *SealedKey `json:"key,omitempty"`
	// Signature is the standard base64 Ed25519 signature over
	// SigningMessage(edge id, entry).
	Signature string `json:"signature"`
}

// SealedKey is a certificate's private key sealed with HPKE (RFC 9180:
// DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM) to one edge's
// encryption key, the HPKE info binding the edge id, the domain and the
// certificate's fingerprint (package tlsseal).
type SealedKey struct {
	// KeyID is the hex SHA-256 of the edge encryption public key it is
	// sealed to.
	KeyID string `json:"key_id"`
	// Enc is the HPKE encapsulated key, standard base64.
	Enc string `json:"enc"`
	// Sealed is the ciphertext of the PEM private key, standard base64.
	Sealed string `json:"sealed"`
}

// MaxSealedKeyBytes bounds a sealed key's ciphertext (a PEM private key of
// at most 16 KiB and its tag), in bytes before base64.
const MaxSealedKeyBytes = 16<<10 + 16

// validate checks a sealed key's form: what opens it is the edge's check.
func (k *SealedKey) validate() error {
	if !isSHA256(k.KeyID) {
		return errors.New("key_id is not 64 lowercase hex digits")
	}
	if enc, err := base64.StdEncoding.DecodeString(k.Enc); err != nil || len(enc) != 32 {
		return errors.New("enc is not the base64 of a 32-byte X25519 encapsulated key")
	}
	if ct, err := base64.StdEncoding.DecodeString(k.Sealed); err != nil || len(ct) <= 16 || len(ct) > MaxSealedKeyBytes {
		return fmt.Errorf("sealed is not base64 of 17–%d bytes", MaxSealedKeyBytes)
	}
	return nil
}

// Manifest is a whole manifest: every page's entries, for one sequence.
type Manifest struct {
	EdgeID   string  `json:"edge_id"`
	Sequence int64   `json:"sequence"`
	Entries  []Entry `json:"entries"`
	// Header and HeaderSignature authenticate the manifest as a whole (see
	// VerifyHeader); a snapshot's manifest.json carries them too.
	Header          Header `json:"header"`
	HeaderSignature string `json:"header_signature"`
	// Assignments, when not nil, are the edge's cell assignments, signed
	// through the header's AssignmentsDigest.
	Assignments *Assignments `json:"assignments,omitempty"`
}

// isSHA256 reports 64 lowercase hex digits.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// SigningMessage is the canonical bytes an entry's signature covers: a
// domain-separation prefix, then edge id, domain, pool, revision, sha256 and
// size, each as a big-endian uint32 length and its bytes, and "rollback"
// for a rollback entry (absent otherwise, so that the entries signed before
// rollbacks existed keep their signatures). Binding the edge id means an
// entry signed for one edge is refused by every other.
func SigningMessage(edgeID string, e Entry) []byte {
	var b bytes.Buffer
	b.Write(signingDomain)
	fields := []string{edgeID, e.Domain, e.Pool, strconv.FormatInt(e.Revision, 10), e.SHA256, strconv.FormatInt(e.Size, 10)}
	if e.Rollback {
		fields = append(fields, "rollback")
	}
	if len(e.Cells) > 0 {
		// Only with cells, so that the signatures of entries without
		// them stay what they were.
		fields = append(fields, "cells", strings.Join(e.Cells, ","))
	}
	if e.Key != nil {
		fields = append(fields, "key", e.Key.KeyID, e.Key.Enc, e.Key.Sealed)
	}
	for _, f := range fields {
		putField(&b, f)
	}
	return b.Bytes()
}

// NewEntry describes artifact for domain/pool/revision and signs it: the
// control plane's side, and the tests'.
func NewEntry(priv ed25519.PrivateKey, edgeID, domain, pool string, revision int64, artifact []byte) Entry {
	sum := sha256.Sum256(artifact)
	e := Entry{Domain: domain, Pool: pool, Revision: revision, Size: int64(len(artifact)), SHA256: hex.EncodeToString(sum[:])}
	e.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(priv, SigningMessage(edgeID, e)))
	return e
}

// Validate checks an entry's fields, not its artifact.
func (e Entry) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: entry %q: %s", ErrInvalid, e.Domain, fmt.Sprintf(format, args...))
	}
	switch {
	case !domain.ValidHostname(e.Domain) || len(e.Domain) > 0 && e.Domain[0] == '*':
		return bad("domain is not a valid hostname")
	case !validPool(e.Pool):
		return bad("pool %q is not a shared-, reserved-, dedicated- or quarantine- pool", e.Pool)
	case e.Revision < 1 || e.Revision > MaxSequence:
		return bad("revision %d is not 1–%d", e.Revision, int64(MaxSequence))
	case e.Size < 1 || e.Size > MaxArtifactBytes:
		return bad("size %d is not 1–%d", e.Size, MaxArtifactBytes)
	case !isSHA256(e.SHA256):
		return bad("sha256 is not 64 lowercase hex digits")
	case len(e.Cells) > 32:
		return bad("%d cells, at most 32", len(e.Cells))
	}
	for i, c := range e.Cells {
		if !isCellName(c) || i > 0 && e.Cells[i-1] >= c {
			return bad("cells must be distinct cell-NN names in order, got %q", e.Cells)
		}
	}
	if e.Key != nil {
		if err := e.Key.validate(); err != nil {
			return bad("key: %v", err)
		}
	}
	sig, err := base64.StdEncoding.DecodeString(e.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("%w: entry %q: signature missing or not %d bytes of base64", ErrSignature, e.Domain, ed25519.SignatureSize)
	}
	return nil
}

func validPool(p string) bool {
	_, ok := domain.PoolClass(p)
	return ok
}

// Verify checks artifact against the entry: size, SHA-256, and the
// signature by pub over the entry bound to edgeID.
func (e Entry) Verify(pub ed25519.PublicKey, edgeID string, artifact []byte) error {
	if err := e.Validate(); err != nil {
		return err
	}
	if int64(len(artifact)) != e.Size {
		return fmt.Errorf("%w: %s revision %d: %d bytes, entry says %d", ErrSize, e.Domain, e.Revision, len(artifact), e.Size)
	}
	sum := sha256.Sum256(artifact)
	if hex.EncodeToString(sum[:]) != e.SHA256 {
		return fmt.Errorf("%w: %s revision %d", ErrDigest, e.Domain, e.Revision)
	}
	sig, _ := base64.StdEncoding.DecodeString(e.Signature)
	if len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, SigningMessage(edgeID, e), sig) {
		return fmt.Errorf("%w: %s revision %d: not signed by the pinned control-plane key", ErrSignature, e.Domain, e.Revision)
	}
	return nil
}

// DecodePage strictly decodes and validates one page.
func DecodePage(data []byte) (Page, error) {
	p, err := ParsePage(data)
	if err != nil {
		return p, err
	}
	return p, p.Validate()
}

// ParsePage strictly decodes one page without validating it, so that a
// source can hand a bad page to Collect, which refuses it knowing its
// sequence.
func ParsePage(data []byte) (Page, error) {
	if len(data) > MaxPageBytes {
		return Page{}, fmt.Errorf("%w: page of %d bytes over %d", ErrInvalid, len(data), MaxPageBytes)
	}
	var p Page
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Page{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if dec.More() {
		return Page{}, fmt.Errorf("%w: trailing data after the page", ErrInvalid)
	}
	return p, nil
}

// Validate checks a page: its bounds and every entry's fields.
func (p Page) Validate() error {
	if p.EdgeID == "" {
		return fmt.Errorf("%w: no edge id", ErrInvalid)
	}
	if p.Sequence < 1 || p.Sequence > MaxSequence {
		return fmt.Errorf("%w: sequence %d is not 1–%d", ErrInvalid, p.Sequence, int64(MaxSequence))
	}
	if len(p.Entries) > MaxEntries {
		return fmt.Errorf("%w: %d entries, at most %d", ErrTooMany, len(p.Entries), MaxEntries)
	}
	seen := map[string]bool{}
	for _, e := range p.Entries {
		if err := e.Validate(); err != nil {
			return err
		}
		if seen[e.Domain] {
			return fmt.Errorf("%w: %s", ErrDuplicate, e.Domain)
		}
		seen[e.Domain] = true
	}
	return nil
}

// Fetch returns the page at cursor ("" for the first) of the manifest after
// sequence after.
type Fetch func(ctx context.Context, after int64, cursor string) (Page, error)

// Collect walks every page of the manifest after sequence active and
// returns it whole, refusing pages for another edge, pages that disagree on
// the sequence or the signed header, more entries than the header counts, a
// sequence that does not move forward, duplicate domains across pages and
// cursors that loop. It does not check the header's signature: see
// VerifyHeader. On a refusal the returned manifest carries the sequence
// when the first page named one within bounds, for the refusal ack.
func Collect(ctx context.Context, fetch Fetch, edgeID string, active int64) (m Manifest, err error) {
	defer func() {
		if err != nil {
			m = Manifest{EdgeID: edgeID, Sequence: m.Sequence}
		}
	}()
	m = Manifest{EdgeID: edgeID}
	var first Page
	seen := map[string]bool{}
	cursors := map[string]bool{}
	cursor := ""
	for n := 0; ; n++ {
		if n == MaxPages {
			return m, fmt.Errorf("%w: more than %d pages", ErrInvalid, MaxPages)
		}
		p, err := fetch(ctx, active, cursor)
		if err != nil {
			return m, err
		}
		if n == 0 {
			if p.Sequence >= 1 && p.Sequence <= MaxSequence {
				m.Sequence = p.Sequence
			}
			first = p
			m.Header, m.HeaderSignature, m.Assignments = p.Header, p.HeaderSignature, p.Assignments
			if p.HeaderSignature == "" {
				return m, fmt.Errorf("%w: sequence %d carries no signed header", ErrHeader, p.Sequence)
			}
		}
		if err := p.Validate(); err != nil {
			return m, err
		}
		switch {
		case p.EdgeID != edgeID:
			return m, fmt.Errorf("%w: page for edge %q, this is %q", ErrInvalid, p.EdgeID, edgeID)
		case p.Sequence != m.Sequence:
			return m, fmt.Errorf("%w: pages disagree on the sequence (%d, %d)", ErrInvalid, m.Sequence, p.Sequence)
		case !sameHeader(first, p):
			return m, fmt.Errorf("%w: page %d carries another header than the first page", ErrHeader, n+1)
		case len(m.Entries)+len(p.Entries) > max(m.Header.Entries, 0):
			return m, fmt.Errorf("%w: pages carry more entries than the header's %d", ErrHeader, m.Header.Entries)
		}
		if m.Sequence <= active {
			return m, fmt.Errorf("%w: manifest sequence %d, active %d", ErrStale, m.Sequence, active)
		}
		for _, e := range p.Entries {
			if seen[e.Domain] {
				return m, fmt.Errorf("%w: %s", ErrDuplicate, e.Domain)
			}
			seen[e.Domain] = true
			m.Entries = append(m.Entries, e)
		}
		if p.Next == "" {
			return m, nil
		}
		if cursors[p.Next] {
			return m, fmt.Errorf("%w: cursor %q repeats", ErrInvalid, p.Next)
		}
		cursors[p.Next] = true
		cursor = p.Next
	}
}

// Paginate splits a manifest into pages of at most size entries, with
// cursors "1", "2", …: the control plane's side, and the tests'.
func Paginate(m Manifest, size int) []Page {
	var pages []Page
	for i := 0; i == 0 || i < len(m.Entries); i += size {
		end := min(i+size, len(m.Entries))
		p := Page{EdgeID: m.EdgeID, Sequence: m.Sequence, Entries: m.Entries[i:end], Header: m.Header, HeaderSignature: m.HeaderSignature, Assignments: m.Assignments}
		if end < len(m.Entries) {
			p.Next = strconv.Itoa(len(pages) + 1)
		}
		pages = append(pages, p)
	}
	return pages
}

// IsRefusal tells a refusal of the manifest's content (ack it as refused)
// from a failure to get it (retry later).
func IsRefusal(err error) bool {
	for _, e := range []error{ErrInvalid, ErrStale, ErrSize, ErrDigest, ErrSignature, ErrDuplicate, ErrTooMany, ErrSnapshot, ErrTooLarge, ErrHeader, ErrRevision} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
