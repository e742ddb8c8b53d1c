// Package outbound owns the agent's governed-egress send path: bundles of
// outbound traffic (security events as siem_forwarding, per-cell request
// counts as metering), their on-disk journal, the route table per traffic
// class resolved from the control API's election answers, the senders
// (direct to the class's destination, or forwarded to the lease holder's
// intake) and the intake that a lease holder serves to its org's peers.
// agent wires it and agentmetrics reads its intake's results: agent and
// agentmetrics import it; it imports no control-plane code.
package outbound

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/egress"
)

// ErrInvalidBundle is a bundle that is not well formed.
var ErrInvalidBundle = errors.New("invalid bundle")

// NewBundle makes a bundle of class with a fresh 128-bit random id.
func NewBundle(org, origin string, class egress.Class, at time.Time, items any) (edgeapi.Bundle, error) {
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return edgeapi.Bundle{}, err
	}
	data, err := json.Marshal(items)
	if err != nil {
		return edgeapi.Bundle{}, fmt.Errorf("encode %s items: %w", class, err)
	}
	return edgeapi.Bundle{ID: hex.EncodeToString(id[:]), Org: org, Class: string(class), Origin: origin, CreatedAt: at.UTC(), Items: data}, nil
}

// Validate checks a bundle's form: its id, class, org and origin.
func Validate(b edgeapi.Bundle) error {
	switch {
	case !isBundleID(b.ID):
		return fmt.Errorf("%w: id %q: want 32 lowercase hex digits", ErrInvalidBundle, b.ID)
	case !egress.Class(b.Class).Valid():
		return fmt.Errorf("%w: class %q", ErrInvalidBundle, b.Class)
	case b.Org == "" || b.Origin == "":
		return fmt.Errorf("%w: bundle %s names no org or origin", ErrInvalidBundle, b.ID)
	case len(b.Items) == 0 || !json.Valid(b.Items):
		return fmt.Errorf("%w: bundle %s: items are not JSON", ErrInvalidBundle, b.ID)
	}
	return nil
}
