package main

import (
	"strings"
	"testing"

	"cellvisor/edgeapi"
)

// TestAgreeOnHolders: the demo's check passes only when, for every class,
// exactly one agent sends direct as the holder the control API named and
// the other forwards to it.
func TestAgreeOnHolders(t *testing.T) {
	ids := [2]string{"e1", "e2"}
	want := map[string]string{"metering": "e1", "siem_forwarding": "e2"}
	direct := func(class, self string) edgeapi.RouteStatus {
		return edgeapi.RouteStatus{Class: class, Route: edgeapi.RouteDirect, Holder: self}
	}
	proxy := func(class, holder string) edgeapi.RouteStatus {
		return edgeapi.RouteStatus{Class: class, Route: edgeapi.RouteProxy, Holder: holder}
	}
	for _, tc := range []struct {
		name    string
		routes  [2][]edgeapi.RouteStatus
		wantErr string
	}{
		{"agreed", [2][]edgeapi.RouteStatus{
			{direct("metering", "e1"), proxy("siem_forwarding", "e2")},
			{proxy("metering", "e1"), direct("siem_forwarding", "e2")}}, ""},
		{"two believers", [2][]edgeapi.RouteStatus{
			{direct("metering", "e1"), proxy("siem_forwarding", "e2")},
			{direct("metering", "e2"), direct("siem_forwarding", "e2")}}, "metering: 2 agents send as the holder"},
		{"holder in the wrong region", [2][]edgeapi.RouteStatus{
			{direct("metering", "e1"), direct("siem_forwarding", "e1")},
			{proxy("metering", "e1"), proxy("siem_forwarding", "e1")}}, "siem_forwarding: e1 sends direct as the holder, want e2"},
		{"nobody holds", [2][]edgeapi.RouteStatus{
			{direct("metering", "e1"), {Class: "siem_forwarding", Route: edgeapi.RouteUnknown}},
			{proxy("metering", "e1"), {Class: "siem_forwarding", Route: edgeapi.RouteUnknown}}}, "siem_forwarding: 0 agents send as the holder"},
		{"a route missing", [2][]edgeapi.RouteStatus{
			{direct("metering", "e1")},
			{proxy("metering", "e1"), direct("siem_forwarding", "e2")}}, "siem_forwarding: e1 has no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := agreeOnHolders(tc.routes, ids, want)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("agreeOnHolders: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("agreeOnHolders: %v, want %q", err, tc.wantErr)
			}
		})
	}
}
