package manifest

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxSequence is the largest manifest sequence: 2^53−1, the largest
// integer a JSON number and the cells' Lua (doubles) hold exactly. A larger
// one is malformed wherever it appears.
const MaxSequence = 1<<53 - 1

// MaxRotations bounds the key-rotation chain a header carries.
const MaxRotations = 64

// ErrHeader is a manifest whose signed header is missing, forged, or does
// not match what the pages carry.
var ErrHeader = errors.New("manifest header invalid")

var (
	headerDomain   = []byte("cellvisor/manifest/v1\x00")
	rotationDomain = []byte("cellvisor/key-rotation/v1\x00")
	digestDomain   = []byte("cellvisor/entries/v1\x00")
)

// Header is what authenticates a manifest as a whole: signed by the
// control plane's key for one edge and one sequence, it binds the number of
// entries and a digest of all of them, so that no entry can be dropped,
// added or replayed under another sequence.
type Header struct {
	EdgeID   string `json:"edge_id"`
	Sequence int64  `json:"sequence"`
	// Entries is the number of entries in the manifest.
	Entries int `json:"entries"`
	// EntriesDigest is EntriesDigest of the manifest's entries.
	EntriesDigest string `json:"entries_digest"`
	// AssignmentsDigest is AssignmentsDigest of the manifest's cell
	// assignments; empty for a manifest without them.
	AssignmentsDigest string `json:"assignments_digest"`
	// Rotations is the control plane's key-rotation chain, oldest first:
	// an edge that pinned an older key follows it to the key that signed
	// this header.
	Rotations []Rotation `json:"rotations,omitempty"`
}

// Rotation announces that the key From is replaced by To: signed by both
// (the old key vouches for the new one, the new one proves it is held).
type Rotation struct {
	// From and To are standard base64 Ed25519 public keys.
	From string `json:"from"`
	To   string `json:"to"`
	// FromSignature and ToSignature are standard base64 signatures over
	// RotationMessage(From, To), by From and by To.
	FromSignature string `json:"from_signature"`
	ToSignature   string `json:"to_signature"`
}

// putField appends a big-endian uint32 length and the bytes of f.
func putField(b *bytes.Buffer, f string) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(f)))
	b.Write(n[:])
	b.WriteString(f)
}

// EntriesDigest is the lowercase hex SHA-256 over the entries' signing
// messages for edgeID, each length-prefixed, in domain order.
func EntriesDigest(edgeID string, entries []Entry) string {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int { return strings.Compare(a.Domain, b.Domain) })
	h := sha256.New()
	h.Write(digestDomain)
	for _, e := range sorted {
		msg := SigningMessage(edgeID, e)
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(msg)))
		h.Write(n[:])
		h.Write(msg)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// SigningMessage is the canonical bytes a header's signature covers: its
// own domain-separation prefix (distinct from the entries'), then every
// field, rotations included, length-prefixed.
func (h Header) SigningMessage() []byte {
	var b bytes.Buffer
	b.Write(headerDomain)
	for _, f := range []string{h.EdgeID, strconv.FormatInt(h.Sequence, 10), strconv.Itoa(h.Entries), h.EntriesDigest,
		h.AssignmentsDigest, strconv.Itoa(len(h.Rotations))} {
		putField(&b, f)
	}
	for _, r := range h.Rotations {
		for _, f := range []string{r.From, r.To, r.FromSignature, r.ToSignature} {
			putField(&b, f)
		}
	}
	return b.Bytes()
}

// RotationMessage is what both keys of a rotation sign.
func RotationMessage(from, to string) []byte {
	var b bytes.Buffer
	b.Write(rotationDomain)
	putField(&b, from)
	putField(&b, to)
	return b.Bytes()
}

// NewRotation announces that from is replaced by to, signed by both.
func NewRotation(from, to ed25519.PrivateKey) Rotation {
	r := Rotation{
		From: base64.StdEncoding.EncodeToString(from.Public().(ed25519.PublicKey)),
		To:   base64.StdEncoding.EncodeToString(to.Public().(ed25519.PublicKey)),
	}
	msg := RotationMessage(r.From, r.To)
	r.FromSignature = base64.StdEncoding.EncodeToString(ed25519.Sign(from, msg))
	r.ToSignature = base64.StdEncoding.EncodeToString(ed25519.Sign(to, msg))
	return r
}

// Sign fills m's header from its entries, with the rotation chain, and
// signs it with priv: the control plane's side, the spool tooling's and the
// tests'.
func Sign(priv ed25519.PrivateKey, m Manifest, rotations []Rotation) Manifest {
	m.Header = Header{EdgeID: m.EdgeID, Sequence: m.Sequence, Entries: len(m.Entries),
		EntriesDigest: EntriesDigest(m.EdgeID, m.Entries), AssignmentsDigest: AssignmentsDigest(m.EdgeID, m.Assignments),
		Rotations: rotations}
	m.HeaderSignature = SignHeader(priv, m.Header)
	return m
}

// SignHeader signs a header.
func SignHeader(priv ed25519.PrivateKey, h Header) string {
	return base64.StdEncoding.EncodeToString(ed25519.Sign(priv, h.SigningMessage()))
}

func verifySig(pub ed25519.PublicKey, msg []byte, sig string) bool {
	s, err := base64.StdEncoding.DecodeString(sig)
	return err == nil && len(s) == ed25519.SignatureSize && len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, msg, s)
}

func decodeKey(s string) (ed25519.PublicKey, bool) {
	k, err := base64.StdEncoding.DecodeString(s)
	return ed25519.PublicKey(k), err == nil && len(k) == ed25519.PublicKeySize
}

// Validate checks a header's fields, not its signature.
func (h Header) Validate() error {
	switch {
	case h.EdgeID == "":
		return fmt.Errorf("%w: no edge id", ErrHeader)
	case h.Sequence < 1 || h.Sequence > MaxSequence:
		return fmt.Errorf("%w: sequence %d is not 1–%d", ErrHeader, h.Sequence, int64(MaxSequence))
	case h.Entries < 0 || h.Entries > MaxEntries*MaxPages:
		return fmt.Errorf("%w: %d entries", ErrHeader, h.Entries)
	case !isSHA256(h.EntriesDigest):
		return fmt.Errorf("%w: entries digest is not 64 lowercase hex digits", ErrHeader)
	case h.AssignmentsDigest != "" && !isSHA256(h.AssignmentsDigest):
		return fmt.Errorf("%w: assignments digest is not 64 lowercase hex digits", ErrHeader)
	case len(h.Rotations) > MaxRotations:
		return fmt.Errorf("%w: %d key rotations, at most %d", ErrHeader, len(h.Rotations), MaxRotations)
	}
	return nil
}

// SignerKey follows h's rotation chain from the pinned key and returns the
// key that must have signed h: pinned itself, or the newest key the chain
// leads to from it. Every rotation walked must be signed by both its keys.
func (h Header) SignerKey(pinned ed25519.PublicKey) (ed25519.PublicKey, error) {
	key := pinned
	cur := base64.StdEncoding.EncodeToString(pinned)
	for i, r := range h.Rotations {
		if r.From != cur {
			continue // a link older than the pinned key
		}
		next, ok := decodeKey(r.To)
		msg := RotationMessage(r.From, r.To)
		if !ok || !verifySig(key, msg, r.FromSignature) || !verifySig(next, msg, r.ToSignature) {
			return nil, fmt.Errorf("%w: key rotation %d is not signed by both its old and its new key", ErrHeader, i+1)
		}
		key, cur = next, r.To
	}
	return key, nil
}

// VerifyHeader authenticates m as a whole for edgeID: its header must be
// signed by the key the pinned key leads to (see SignerKey), name this edge
// and m's sequence, and match m's entries in number and digest. It returns
// the signing key, for the edge to pin from then on.
func (m Manifest) VerifyHeader(pinned ed25519.PublicKey, edgeID string) (ed25519.PublicKey, error) {
	h := m.Header
	if m.HeaderSignature == "" {
		return nil, fmt.Errorf("%w: sequence %d carries no signed header", ErrHeader, m.Sequence)
	}
	if err := h.Validate(); err != nil {
		return nil, err
	}
	signer, err := h.SignerKey(pinned)
	if err != nil {
		return nil, err
	}
	if !verifySig(signer, h.SigningMessage(), m.HeaderSignature) {
		return nil, fmt.Errorf("%w: sequence %d: header not signed by the pinned control-plane key", ErrHeader, m.Sequence)
	}
	switch {
	case h.EdgeID != edgeID:
		return nil, fmt.Errorf("%w: header for edge %q, this is %q", ErrHeader, h.EdgeID, edgeID)
	case h.Sequence != m.Sequence:
		return nil, fmt.Errorf("%w: header for sequence %d, pages say %d", ErrHeader, h.Sequence, m.Sequence)
	case h.Entries != len(m.Entries):
		return nil, fmt.Errorf("%w: sequence %d: header says %d entries, pages carry %d", ErrHeader, m.Sequence, h.Entries, len(m.Entries))
	case h.EntriesDigest != EntriesDigest(edgeID, m.Entries):
		return nil, fmt.Errorf("%w: sequence %d: entries do not match the header's digest", ErrHeader, m.Sequence)
	case h.AssignmentsDigest != AssignmentsDigest(edgeID, m.Assignments):
		return nil, fmt.Errorf("%w: sequence %d: cell assignments do not match the header's digest", ErrHeader, m.Sequence)
	}
	if m.Assignments != nil {
		if err := m.Assignments.Validate(); err != nil {
			return nil, err
		}
	}
	return signer, nil
}

// sameHeader reports whether two pages carry the same signed header.
func sameHeader(a, b Page) bool {
	return a.HeaderSignature == b.HeaderSignature && bytes.Equal(a.Header.SigningMessage(), b.Header.SigningMessage())
}
