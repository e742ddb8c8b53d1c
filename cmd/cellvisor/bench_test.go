package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/testkit/testutil"
)

// BenchmarkAgentRSS starts the real agent with every slot assigned and
// running, and reports its resident memory (VmRSS) once all cells are ready.
// Target: under 40 MiB with 8 and with 32 slots.
func BenchmarkAgentRSS(b *testing.B) {
	testutil.RequireRoot(b)
	bin := buildAgent(b)
	for _, slots := range []int{8, 32} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			cfgPath, cfg := agentConfig(b, slots, "")
			all := runtime.Assignments{}
			for i := 1; i <= slots; i++ {
				all[runtime.SlotName(i)] = domain.PoolSharedDefault
			}
			if err := os.MkdirAll(cfg.StateDir, 0o750); err != nil {
				b.Fatal(err)
			}
			data, _ := json.Marshal(all)
			if err := os.WriteFile(filepath.Join(cfg.StateDir, "assignments.json"), data, 0o644); err != nil {
				b.Fatal(err)
			}
			a, st := startAgent(b, bin, cfgPath, cfg)
			ready := 0
			for _, s := range st.Slots {
				if s.State == "ready" {
					ready++
				}
			}
			if ready != slots {
				b.Fatalf("%d of %d cells ready", ready, slots)
			}
			var rss float64
			for b.Loop() {
				rss = vmRSS(b, a.cmd.Process.Pid)
			}
			b.ReportMetric(rss, "MiB-rss")
		})
	}
}

func vmRSS(b *testing.B, pid int) float64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
