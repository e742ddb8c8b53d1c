package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"cellvisor/agent"
	"cellvisor/cgexec"
	"cellvisor/cgroup"
	"cellvisor/testkit/testutil"
)

// The exec'd floors split the start's distance to the floor into what any
// supervisor of the agent's design pays on this host and what the agent
// adds with its own work. floorspawn (testkit/floorspawn), exec'd from
// cold as the agent is, starts the same 8 masters:
//
//   - floor-exec: bare, as the in-process floor starts them;
//   - floor-held: bare, with their ports bound by floorspawn and handed
//     over, as the agent hands them (a client then waits in the backlog
//     instead of being refused until the master binds, which also spares
//     the benchmark's pollers their refused dials);
//   - floor-cg: held, and each master inside cgroups of its own with the
//     agent's limits, joined before its first instruction by the agent's
//     own join helper, the groups created while the cells start (cgroup
//     v1; on v2 the agent clones a cell into its group, which floorspawn
//     does not, and this floor is skipped with the reason logged).
//
// floor-cg is the agent's design with none of the agent's own work, so the
// agent's start against it (ratio-start-vs-floor-cg) is what the agent
// itself costs.

// floorSpawnNames are the exec'd floors, in the order each iteration runs
// them.
var floorSpawnNames = []string{"floor-exec", "floor-held", "floor-cg"}

// floorSpec mirrors testkit/floorspawn's spec.
type floorSpec struct {
	Cells []floorCell `json:"cells"`
}

type floorCell struct {
	Groups []floorGroup   `json:"groups,omitempty"`
	Join   []string       `json:"join,omitempty"`
	Argv   []string       `json:"argv"`
	Listen []floorAddress `json:"listen,omitempty"`
}

type floorGroup struct {
	Dir    string      `json:"dir"`
	Limits [][2]string `json:"limits"`
}

type floorAddress struct {
	IP   string `json:"ip"`
	Port int    `json:"port"`
}

// floorCgName names floor-cg's group for the i-th slot, in the
// benchmark's cgroup subtree beside the group the classic supervisors run
// in.
func floorCgName(i int) string { return "floorcg-" + strconv.Itoa(i+1) }

// floorSpawns builds floorspawn and writes a spec for each exec'd floor
// this host can run.
func (e *wholeEnv) floorSpawns(b *testing.B, m cgroup.Manager) {
	b.Helper()
	e.spawn = filepath.Join(b.TempDir(), "floorspawn")
	if err := testutil.GoBuild("cellvisor/testkit/floorspawn", e.spawn, cgexec.LDFlags()); err != nil {
		b.Fatal(err)
	}
	e.spawnSpecs = map[string]string{}
	write := func(name string, s floorSpec) {
		data, err := json.Marshal(s)
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(b.TempDir(), name+".json")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			b.Fatal(err)
		}
		e.spawnSpecs[name] = p
	}
	ip := e.cfg.Ports.Address
	if ip == "" {
		ip = "0.0.0.0" // as the agent binds `listen PORT`
	}
	var bare, held, cg floorSpec
	for _, s := range e.slots {
		c := floorCell{Argv: append([]string{e.nginx}, nginxArgs(s)...)}
		bare.Cells = append(bare.Cells, c)
		c.Listen = []floorAddress{{ip, s.HTTPPort}, {ip, s.HTTPSPort}}
		held.Cells = append(held.Cells, c)
	}
	write("floor-exec", bare)
	write("floor-held", held)
	if m.Mode() != cgroup.ModeV1Hybrid {
		b.Logf("floor-cg skipped: cgroup mode %s (floorspawn joins v1 groups only)", m.Mode())
		return
	}
	e.cg = m
	// What the agent writes (cgroup.v1's ensureAt), in its order: memory,
	// cpu, pids, then cpuacct where it is a hierarchy of its own
	// (created, no limits).
	l := agent.CellLimits(e.cfg)
	limits := map[string][][2]string{
		"memory": {{"memory.limit_in_bytes", strconv.FormatInt(l.MemoryBytes, 10)}},
		"cpu": {
			{"cpu.cfs_period_us", strconv.FormatUint(l.CPUPeriodUS, 10)},
			{"cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuotaUS, 10)},
		},
		"pids": {{"pids.max", strconv.FormatInt(l.PIDs, 10)}},
	}
	paths := e.floor.Paths()
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", paths["cpu"], "cpu.cfs_burst_us")); err == nil {
		limits["cpu"] = append(limits["cpu"], [2]string{"cpu.cfs_burst_us", strconv.FormatUint(l.CPUBurstUS, 10)})
	}
	for i, c := range held.Cells {
		var tasks []string
		for _, ctrl := range []string{"memory", "cpu", "pids", "cpuacct"} {
			if p, ok := paths[ctrl]; ok {
				dir := filepath.Join("/sys/fs/cgroup", ctrl, path.Dir(p), floorCgName(i))
				c.Groups = append(c.Groups, floorGroup{Dir: dir, Limits: limits[ctrl]})
				tasks = append(tasks, filepath.Join(dir, "tasks"))
			}
		}
		c.Join = tasks
		cg.Cells = append(cg.Cells, c)
	}
	write("floor-cg", cg)
	b.Cleanup(func() { e.removeFloorCg(b) })
}

// removeFloorCg kills and removes floor-cg's groups, where they are.
func (e *wholeEnv) removeFloorCg(b *testing.B) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range e.slots {
		g, err := e.cg.Open(floorCgName(i))
		if err != nil {
			continue // not made
		}
		if err := g.Delete(ctx); err != nil {
			b.Error(err)
		}
	}
}

// spawnFloor execs floorspawn for the named floor and returns when, and
// its stop function, which ends it (it kills and reaps its cells) and
// removes the groups it made.
func (e *wholeEnv) spawnFloor(b *testing.B, name string) (time.Time, func()) {
	b.Helper()
	for _, s := range e.slots {
		os.Remove(s.PrivateSocket()) // what the supervisor does too
	}
	cmd := exec.Command(e.spawn, e.spawnSpecs[name])
	cmd.Stderr = os.Stderr
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("floorspawn (%s): %v", name, err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			b.Errorf("floorspawn (%s) did not stop on SIGTERM", name)
		}
		if name == "floor-cg" {
			e.removeFloorCg(b)
		}
	}
	b.Cleanup(stop)
	return t0, stop
}

// checkFloorCg fails the benchmark unless every cell floor-cg started runs
// inside all of its groups: it enforces what the agent enforces, or it is
// no floor.
func (e *wholeEnv) checkFloorCg(b *testing.B) {
	b.Helper()
	for i, s := range e.slots {
		g, err := e.cg.Open(floorCgName(i))
		if err != nil {
			b.Fatal(err)
		}
		masters := nginxProcs(b, g, e.nginx)
		if len(masters) == 0 {
			b.Fatalf("floor-cg: %s answers but no nginx of it is in its group", s.Name)
		}
		for _, pid := range masters {
			if !inAll(g, pid) {
				b.Fatalf("floor-cg: %s's nginx %d is not in all of its groups", s.Name, pid)
			}
		}
	}
}
