package activation

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"cellvisor/controlclient"
	"cellvisor/domain"
	"cellvisor/manifest"
)

// Stats follow what polls did: an applied manifest, then a refused one
// (counted once by its class however often the source serves it).
func TestStatsCountOutcomesAndRefusals(t *testing.T) {
	r := newRig(t)
	if s := r.a.Stats(); s.Last.Outcome != "" || len(s.Outcomes) != 0 {
		t.Fatalf("stats before any poll: %+v", s)
	}
	r.publish(1, map[string]string{"a.example.com": "one"})
	if err := r.a.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := r.a.Stats()
	if s.Last.Outcome != OutcomeApplied || s.Last.Sequence != 1 || s.Outcomes[OutcomeApplied] != 1 || s.Last.Duration < 0 {
		t.Fatalf("after an applied manifest: %+v", s)
	}
	spool := controlclient.DirSource{Dir: t.TempDir()}
	r.a.o.Source = spool
	r.publish(2, map[string]string{"a.example.com": "two"})
	m := r.src.m
	m.Entries = append(m.Entries, m.Entries[0]) // a duplicate domain
	if err := spool.Publish(manifest.Sign(r.priv, m, nil), r.src.artifacts); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := r.a.Poll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	s = r.a.Stats()
	if s.Last.Outcome != OutcomeRefused || s.Last.Sequence != 2 || s.Outcomes[OutcomeRefused] != 1 || s.Refusals["duplicate"] != 1 {
		t.Errorf("after a refused manifest served 3 times: %+v", s)
	}
	// A copy: changing it changes nothing inside.
	s.Refusals["duplicate"] = 99
	if r.a.Stats().Refusals["duplicate"] != 1 {
		t.Error("Stats returned the activator's own map")
	}
}

func TestRefusalClass(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("entry x: %w", manifest.ErrSignature), "signature"},
		{fmt.Errorf("%w: %w", manifest.ErrInvalid, manifest.ErrDigest), "digest"},
		{fmt.Errorf("x: %w", domain.ErrInvalid), "domain_invalid"},
		{fmt.Errorf("x: %w", errUnknownPool), "unknown_pool"},
		{manifest.ErrInvalid, "invalid"},
		{errors.New("something else"), "other"},
	} {
		if got := RefusalClass(tc.err); got != tc.want {
			t.Errorf("RefusalClass(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
