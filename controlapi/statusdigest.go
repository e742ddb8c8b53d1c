package controlapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"cellvisor/edgeapi"
)

// volatile are the fields of an agent's status that change with every
// report without the edge having changed: times of the last contact and
// measurements (memory, CPU, connections, request counts). A report whose
// other content equals the last one written is unchanged; its
// measurements are written at most every StatusRewrite. Per slot ("slots"
// entries) and per slot's cell report ("cell").
var (
	volatileControl = []string{"last_poll", "last_success"}
	volatileSlot    = []string{"usage", "liveness"}
	volatileCell    = []string{"connections", "requests", "refused", "cache", "origins"}
	// volatileReach: when a destination probe ran (its outcome is not
	// volatile). The stored probe is refreshed at least every
	// StatusRewrite, inside the egress reach window.
	volatileReach = []string{"checked_at"}
)

// statusDigest is the SHA-256 of an agent's status with its volatile
// fields removed, in a canonical form (object keys sorted), of sum, the
// status as the control plane reads it (a status whose keys repeat reads
// differently as a map and as a Summary: both count), and of its gateways
// without their round-trip times (health and topology are not volatile; a
// gateway row's RTT and last-seen are refreshed at least every
// StatusRewrite).
func statusDigest(raw []byte, sum edgeapi.Summary, gateways []edgeapi.Gateway) ([32]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return [32]byte{}, fmt.Errorf("status digest: %w", err)
	}
	if top, ok := v.(map[string]any); ok {
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
	}
	gws := make([]edgeapi.Gateway, len(gateways))
	for i, g := range gateways {
		g.RTTMicros = 0
		gws[i] = g
	}
	if sum.Egress != nil {
		// A probe's time is volatile; whether it has one is not (a probe
		// without one is not stored).
		e := *sum.Egress
		e.Reach = make(map[string]edgeapi.ReachReport, len(sum.Egress.Reach))
		for class, r := range sum.Egress.Reach {
			if !r.CheckedAt.IsZero() {
				r.CheckedAt = time.Unix(1, 0).UTC()
			}
			e.Reach[class] = r
		}
		sum.Egress = &e
	}
	canon, err := json.Marshal(struct {
		Status   any               `json:"status"`
		Read     edgeapi.Summary   `json:"read"`
		Gateways []edgeapi.Gateway `json:"gateways"`
		Reported bool              `json:"reported"` // nil (rows kept) differs from none
	}{v, sum, gws, gateways != nil})
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
