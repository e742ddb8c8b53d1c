package statusdigest

import (
	"testing"

	"cellvisor/edgeapi"
)

// Measurements and contact times do not move the digest; anything else
// does, and so do gateways reported or not.
func TestOf(t *testing.T) {
	base := `{"version":"1","control":{"last_poll":"a","error":""},"slots":[{"name":"cell-01","state":"ready","usage":{"memory":1},"cell":{"connections":3,"ready":true}}],"egress":{"reach":{"metering":{"reachable":true,"checked_at":"t1"}}}}`
	digest := func(s string, gw []edgeapi.Gateway) [32]byte {
		t.Helper()
		d, err := Of([]byte(s), gw)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := digest(base, nil)
	for _, tc := range []struct {
		name   string
		status string
		gw     []edgeapi.Gateway
		same   bool
	}{
		{"measurements and times", `{"version":"1","control":{"last_poll":"b","error":""},"slots":[{"name":"cell-01","state":"ready","usage":{"memory":9},"cell":{"connections":7,"ready":true}}],"egress":{"reach":{"metering":{"reachable":true,"checked_at":"t2"}}}}`, nil, true},
		{"a cell's state", `{"version":"1","control":{"last_poll":"a","error":""},"slots":[{"name":"cell-01","state":"degraded","usage":{"memory":1},"cell":{"connections":3,"ready":true}}],"egress":{"reach":{"metering":{"reachable":true,"checked_at":"t1"}}}}`, nil, false},
		{"a probe's outcome", `{"version":"1","control":{"last_poll":"a","error":""},"slots":[{"name":"cell-01","state":"ready","usage":{"memory":1},"cell":{"connections":3,"ready":true}}],"egress":{"reach":{"metering":{"reachable":false,"checked_at":"t1"}}}}`, nil, false},
		{"a control error", `{"version":"1","control":{"last_poll":"a","error":"x"},"slots":[{"name":"cell-01","state":"ready","usage":{"memory":1},"cell":{"connections":3,"ready":true}}],"egress":{"reach":{"metering":{"reachable":true,"checked_at":"t1"}}}}`, nil, false},
		{"gateways reported, none", base, []edgeapi.Gateway{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := digest(tc.status, tc.gw); (got == want) != tc.same {
				t.Errorf("digest equal %v, want %v", got == want, tc.same)
			}
		})
	}
	if _, err := Of([]byte("{"), nil); err == nil {
		t.Error("a status that is not JSON: no error")
	}
}
