// Package statusdigest says when an agent's status report changed: it
// names the fields of a report that change with every report without the
// edge having changed (times of the last contact, measurements), and
// digests a report without them. The agent sends its status when the
// digest moves (and otherwise every status interval); the control API
// writes a report when its digest moves (and otherwise every rewrite
// interval). One definition on both sides, so they cannot drift apart.
// controlapi and controlclient import it.
package statusdigest

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"

	"cellvisor/edgeapi"
)

// The volatile fields, by where they are in the status object: its
// "control" object, each "slots" entry and its "cell" report, and each
// destination probe of "egress"."reach" (when it ran; its outcome is not
// volatile).
var (
	volatileControl = []string{"last_poll", "last_success"}
	volatileSlot    = []string{"usage", "liveness"}
	volatileCell    = []string{"connections", "requests", "refused", "cache", "origins"}
	volatileReach   = []string{"checked_at"}
)

// Stable decodes a status object (numbers kept as written) without its
// volatile fields.
func Stable(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("status digest: %w", err)
	}
	top, ok := v.(map[string]any)
	if !ok {
		return v, nil
	}
	if c, ok := top["control"].(map[string]any); ok {
		drop(c, volatileControl)
	}
	if e, ok := top["egress"].(map[string]any); ok {
		if reach, ok := e["reach"].(map[string]any); ok {
			for _, r := range reach {
				if r, ok := r.(map[string]any); ok {
					drop(r, volatileReach)
				}
			}
		}
	}
	if slots, ok := top["slots"].([]any); ok {
		for _, sl := range slots {
			slot, ok := sl.(map[string]any)
			if !ok {
				continue
			}
			drop(slot, volatileSlot)
			if c, ok := slot["cell"].(map[string]any); ok {
				drop(c, volatileCell)
			}
		}
	}
	return v, nil
}

// StableGateways are gateways without their round-trip times (health and
// topology are not volatile).
func StableGateways(gateways []edgeapi.Gateway) []edgeapi.Gateway {
	out := make([]edgeapi.Gateway, len(gateways))
	for i, g := range gateways {
		g.RTTMicros = 0
		out[i] = g
	}
	return out
}

// Of is the SHA-256 of a report's stable part: its status object and its
// gateways (nil, none reported, differs from an empty list), in a
// canonical form (object keys sorted).
func Of(status []byte, gateways []edgeapi.Gateway) ([32]byte, error) {
	v, err := Stable(status)
	if err != nil {
		return [32]byte{}, err
	}
	canon, err := json.Marshal(struct {
		Status   any               `json:"status"`
		Gateways []edgeapi.Gateway `json:"gateways"`
		Reported bool              `json:"reported"`
	}{v, StableGateways(gateways), gateways != nil})
	if err != nil {
		return [32]byte{}, fmt.Errorf("status digest: %w", err)
	}
	return sha256.Sum256(canon), nil
}

func drop(m map[string]any, keys []string) {
	for _, k := range keys {
		delete(m, k)
	}
}
