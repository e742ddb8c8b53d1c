package main

import (
	"net/http"
	"testing"
	"time"

	"cellvisor/controlapi/adminapi"
)

func TestEdgeTokenTTL(t *testing.T) {
	ep := startControl(t)
	near := func(what string, got, want time.Time) {
		t.Helper()
		if d := got.Sub(want); d < -time.Minute || d > time.Minute {
			t.Errorf("%s: token expires %v, want about %v", what, got, want)
		}
	}
	created := decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "create", "--name", "fra-1", "--org", "acme",
		"--country", "DE", "--continent", "EU", "--token-ttl", "2h", "-o", "json"))
	near("edge create --token-ttl 2h", created.TokenExpiresAt, time.Now().Add(2*time.Hour))
	if created.Edge.TokenExpiresAt == nil || !created.Edge.TokenExpiresAt.Equal(created.TokenExpiresAt) {
		t.Errorf("edge create: the edge shows its token expiring %v, want %v", created.Edge.TokenExpiresAt, created.TokenExpiresAt)
	}
	rotated := decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "rotate", created.Edge.ID, "--token-ttl", "30m", "-o", "json"))
	near("edge rotate --token-ttl 30m", rotated.TokenExpiresAt, time.Now().Add(30*time.Minute))
	rotated = decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "rotate", created.Edge.ID, "-o", "json"))
	near("edge rotate", rotated.TokenExpiresAt, time.Now().Add(adminapi.DefaultTokenTTL))
	defaulted := decodeJSON[adminapi.CreatedEdge](t, mustCtl(t, ep, "edge", "create", "--name", "fra-2", "--org", "acme",
		"--country", "DE", "--continent", "EU", "-o", "json"))
	near("edge create", defaulted.TokenExpiresAt, time.Now().Add(adminapi.DefaultTokenTTL))

	_, err := ctl(t, ep, "edge", "create", "--name", "fra-3", "--org", "acme", "--country", "DE", "--continent", "EU", "--token-ttl", "10s")
	wantAdminError(t, err, http.StatusBadRequest, "token_ttl")
	_, err = ctl(t, ep, "edge", "rotate", created.Edge.ID, "--token-ttl", "800h")
	wantAdminError(t, err, http.StatusBadRequest, "token_ttl")
}
