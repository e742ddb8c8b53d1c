package controlapi

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"cellvisor/edgeapi"
	"cellvisor/edgeapi/statusdigest"
)

// statusDigest is the SHA-256 of an agent's status with its volatile
// fields removed (statusdigest.Stable), in a canonical form (object keys
// sorted), of sum, the status as the control plane reads it (a status
// whose keys repeat reads differently as a map and as a Summary: both
// count), and of its gateways without their round-trip times. A report
// whose digest equals the last one written is unchanged; its measurements
// are written at most every StatusRewrite (a gateway row's RTT and
// last-seen, an egress probe's time with them).
func statusDigest(raw []byte, sum edgeapi.Summary, gateways []edgeapi.Gateway) ([32]byte, error) {
	v, err := statusdigest.Stable(raw)
	if err != nil {
		return [32]byte{}, err
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
	}{v, sum, statusdigest.StableGateways(gateways), gateways != nil})
	if err != nil {
		return [32]byte{}, fmt.Errorf("status digest: %w", err)
	}
	return sha256.Sum256(canon), nil
}
