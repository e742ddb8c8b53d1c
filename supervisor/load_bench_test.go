package supervisor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"cellvisor/domain"
)

// manyDomains are n domains of a shared pool as tenants have them: two
// hostnames, an origin, three routes, a cache TTL on every other one; the
// first is at revision rev and answers "v<rev>" on /static, the others
// stay the same.
func manyDomains(n, rev int) []domain.Domain {
	out := make([]domain.Domain, n)
	for i := range out {
		name := fmt.Sprintf("tenant-%05d.example.com", i)
		body := "static page of " + name
		if i == 0 {
			name, body = testHost, "v"+strconv.Itoa(rev)
		}
		revision := int64(1)
		if i == 0 {
			revision = int64(rev) // a publish changes one domain
		}
		d := domain.Domain{Domain: name, Pool: domain.PoolSharedDefault, Revision: revision,
			Hostnames: []string{name, "www." + name},
			Origins:   []domain.Origin{{Name: "app", URL: "http://127.0.0.1:9"}},
			Routes: []domain.Route{
				{Prefix: "/", Origin: "app"},
				{Prefix: "/api/", Origin: "app"},
				{Prefix: "/static", Respond: &domain.Response{Status: 200, Body: body}},
			}}
		if i%2 == 1 {
			d.Cache = &domain.Cache{TTLSeconds: 60 + i%600}
		}
		out[i] = d
	}
	return out
}

// BenchmarkPublishServed measures publish → served at one cell serving
// 1,000 domains: from the agent handing over a switched release (Apply for
// a load; a SIGHUP, today's path before loads, for a reload) to the first
// answer of the new release. Each op is one publish of a changed respond
// body; p50/p99 are over the run's publishes (make bench runs 1,000), and
// new-workers/op counts worker generations.
func BenchmarkPublishServed(b *testing.B) {
	for _, path := range []string{"load", "reload"} {
		b.Run(path, func(b *testing.B) {
			h := newHarness(b, harnessOpts{slots: 1, domains: manyDomains(1000, 1)})
			port := h.waitReady("cell-01", 0).HTTPPort
			api := privateClient(b, h, "cell-01", nil)
			var took []time.Duration
			workers := 0
			pid := cellStatus(b, api).WorkerPID
			seq := int64(1)
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				seq++
				h.activate(seq, manyDomains(1000, int(seq)))
				want := "v" + strconv.Itoa(int(seq))
				b.StartTimer()
				t0 := time.Now()
				if path == "load" {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					how, err := h.sup.Apply(ctx, "cell-01")
					cancel()
					if err != nil || how != "loaded" {
						b.Fatalf("apply: %s %v", how, err)
					}
				} else if err := h.sup.Reload("cell-01"); err != nil {
					b.Fatal(err)
				}
				for deadline := t0.Add(30 * time.Second); ; {
					if _, body, err := get(port, "/static"); err == nil && body == want {
						break
					}
					if time.Now().After(deadline) {
						b.Fatalf("publish %d not served in 30s", seq)
					}
				}
				took = append(took, time.Since(t0))
				b.StopTimer()
				if now := cellStatus(b, api).WorkerPID; now != pid {
					workers, pid = workers+1, now
				}
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[min(len(took)-1, len(took)*99/100)].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(workers)/float64(len(took)), "new-workers/op")
		})
	}
}

// BenchmarkDataLoad measures a cell's load of a release of 1,000 and
// 10,000 domains: the time the cell took to read and build it (its own
// loads.last_ms) and its worker's Lua heap with the data in it.
func BenchmarkDataLoad(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("domains="+strconv.Itoa(n), func(b *testing.B) {
			h := newHarness(b, harnessOpts{slots: 1, domains: manyDomains(2, 1)}) // a cached one: the same shape
			h.waitReady("cell-01", 0)
			api := privateClient(b, h, "cell-01", nil)
			empty := cellStatus(b, api).LuaKB
			seq := int64(1)
			var ms, kb, size int64
			for b.Loop() {
				b.StopTimer()
				seq++
				h.activate(seq, manyDomains(n, int(seq)))
				b.StartTimer()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				how, err := h.sup.Apply(ctx, "cell-01")
				cancel()
				if err != nil || how != "loaded" {
					b.Fatalf("apply: %s %v", how, err)
				}
				b.StopTimer()
				st := cellStatus(b, api)
				ms += st.Loads.LastMs
				// The heap once the cell has freed what the load replaced
				// (in steps, after it answered): two readings alike.
				for i := 0; i < 100; i++ {
					time.Sleep(20 * time.Millisecond) // a sampling interval
					next := cellStatus(b, api)
					if next.LuaKB == st.LuaKB {
						break
					}
					st = next
				}
				kb = max(kb, st.LuaKB-empty)
				if fi, err := os.Stat(filepath.Join(h.slotSpec("cell-01").RuntimeDir(), "current", "pools", domain.PoolSharedDefault+".json")); err == nil {
					size = fi.Size()
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(ms)/float64(b.N), "cell-load-ms")
			b.ReportMetric(float64(kb)/1024, "lua-MiB")
			b.ReportMetric(float64(size)/(1<<20), "data-MiB")
		})
	}
}
