package main

import (
	"testing"
	"time"
)

func TestExpiringNote(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	day := int64(86400)
	certs := map[string]int64{
		"far.test":  now.Unix() + 60*day,
		"soon.test": now.Unix() + 3*day - 10,
		"gone.test": now.Unix() - day,
		"edge.test": now.Unix() + 14*day - 1,
		"next.test": now.Unix() + 10*day,
	}
	got := expiringNote(certs, now)
	want := "certificate expiring: gone.test expired, soon.test in 3d, next.test in 10d, and 1 more"
	if got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if got := expiringNote(map[string]int64{"far.test": certs["far.test"]}, now); got != "" {
		t.Errorf("nothing expiring: %q", got)
	}
}
