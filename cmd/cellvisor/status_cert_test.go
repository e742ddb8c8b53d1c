package main

import (
	"testing"
	"time"

	"cellvisor/cellapi"
)

func TestExpiringNote(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	day := int64(86400)
	certs := map[string]cellapi.Certificate{
		"far.test":  {NotAfter: now.Unix() + 60*day},
		"soon.test": {NotAfter: now.Unix() + 3*day - 10},
		"gone.test": {NotAfter: now.Unix() - day},
		"edge.test": {NotAfter: now.Unix() + 14*day - 1},
		"next.test": {NotAfter: now.Unix() + 10*day},
	}
	got := expiringNote(certs, now)
	want := "certificate expiring: gone.test expired, soon.test in 3d, next.test in 10d, and 1 more"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := expiringNote(map[string]cellapi.Certificate{"far.test": certs["far.test"]}, now); got != "" {
		t.Errorf("nothing expiring: %q", got)
	}
}
