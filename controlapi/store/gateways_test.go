package store

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func gw(service string, port int, healthy bool) Gateway {
	return Gateway{Service: service, Protocol: service, Host: "127.0.0.1", Port: port, TLS: service == "https",
		Region: "eu-central", Zone: "eu-central-1a", Locality: "fra", Priority: 1, CostTier: 2, Weight: 10,
		RTT: 1500 * time.Microsecond, Healthy: healthy}
}

// TestSyncNeverTouchesFrontDoor: the agent's reports refresh health and
// topology, the operator's front-door URL survives every one of them, even
// a report that no longer names the service.
func TestSyncNeverTouchesFrontDoor(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		e := newEdge(t, s, "fra-1")
		url := "https://shop.example.com:443"
		if _, err := s.SetFrontDoor(ctx(t), e.ID, "https", url); err != nil {
			t.Fatal(err)
		}
		at := time.UnixMilli(1_700_000_000_000)
		if err := s.SyncGateways(ctx(t), e.ID, []Gateway{gw("http", 8080, true), gw("https", 8443, true)}, at); err != nil {
			t.Fatal(err)
		}
		changed := gw("https", 9443, false)
		changed.Region, changed.RTT = "eu-west", 7*time.Millisecond
		changed.FrontDoorURL = "https://forged.example.com:443" // a report cannot carry one
		if err := s.SyncGateways(ctx(t), e.ID, []Gateway{gw("http", 8080, true), changed}, at.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err := s.Gateways(ctx(t), e.ID)
		if err != nil || len(got) != 2 {
			t.Fatalf("gateways %+v, %v", got, err)
		}
		h := got[1]
		if h.Service != "https" || h.FrontDoorURL != url || h.Port != 9443 || h.Healthy || h.Region != "eu-west" ||
			h.RTT != 7*time.Millisecond || !h.LastSeen.Equal(at.Add(time.Second)) || h.Org != "acme" {
			t.Fatalf("after sync: %+v", h)
		}
		// A report without the https service: the row stays for its front
		// door, unhealthy; the http row it drops without one goes.
		if err := s.SyncGateways(ctx(t), e.ID, nil, at.Add(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err = s.Gateways(ctx(t), e.ID)
		if err != nil || len(got) != 1 || got[0].Service != "https" || got[0].FrontDoorURL != url || got[0].Healthy {
			t.Fatalf("after an empty report: %+v, %v", got, err)
		}
	})
}

func TestFrontDoorUniqueness(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		a, b := newEdge(t, s, "fra-1"), newEdge(t, s, "fra-2")
		url := "https://shop.example.com:443"
		if _, err := s.SetFrontDoor(ctx(t), a.ID, "https", url); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetFrontDoor(ctx(t), b.ID, "https", url); !errors.Is(err, ErrConflict) {
			t.Fatalf("second edge took %s: %v", url, err)
		}
		// The index itself, not only SetFrontDoor, refuses a second row.
		if _, err := s.db.ExecContext(ctx(t), s.q(`INSERT INTO gateways (edge_id, service, front_door_url) VALUES (?, 'raw', ?)`), b.ID, url); !isUnique(err) {
			t.Fatalf("the index admitted a second row for %s: %v", url, err)
		}
		// One front door per edge: setting another URL on another service
		// moves it.
		if _, err := s.SetFrontDoor(ctx(t), a.ID, "http", "http://shop.example.com:80"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.ExecContext(ctx(t), s.q(`UPDATE gateways SET front_door_url = ? WHERE edge_id = ? AND service = 'https'`), url, a.ID); !isUnique(err) {
			t.Fatalf("the index admitted two front doors on edge %s: %v", a.ID, err)
		}
		fds, err := s.FrontDoors(ctx(t), "acme")
		if err != nil || len(fds) != 1 || fds[0].EdgeID != a.ID || fds[0].FrontDoorURL != "http://shop.example.com:80" {
			t.Fatalf("front doors %+v, %v", fds, err)
		}
		// Now free: the other edge takes it.
		if _, err := s.SetFrontDoor(ctx(t), b.ID, "https", url); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.ClearFrontDoor(ctx(t), a.ID); !ok || err != nil {
			t.Fatalf("clear: %v, %v", ok, err)
		}
		if ok, err := s.ClearFrontDoor(ctx(t), a.ID); ok || err != nil {
			t.Fatalf("second clear: %v, %v", ok, err)
		}
		if fds, err := s.FrontDoors(ctx(t), "other-org"); err != nil || len(fds) != 0 {
			t.Fatalf("another org's front doors %+v, %v", fds, err)
		}
		if _, err := s.SetFrontDoor(ctx(t), "no-such-edge", "https", "https://x.example.com:443"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("unknown edge: %v", err)
		}
	})
}

// TestFrontDoorRace: edges setting the same URL at once; exactly one holds
// it, every other is told ErrConflict.
func TestFrontDoorRace(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		const n = 6
		var edges []Edge
		for i := 0; i < n; i++ {
			edges = append(edges, newEdge(t, s, "race-"+string(rune('a'+i))))
		}
		url := "https://race.example.com:443"
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range edges {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				_, errs[i] = s.SetFrontDoor(ctx(t), edges[i].ID, "https", url)
			}(i)
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ErrConflict):
				t.Errorf("edge %d: %v", i, err)
			}
		}
		fds, err := s.FrontDoors(ctx(t), "")
		if won != 1 || err != nil || len(fds) != 1 {
			t.Fatalf("%d winners, rows %+v, %v", won, fds, err)
		}
	})
}
