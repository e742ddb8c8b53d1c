package supervisor_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/runtime"
	"cellvisor/supervisor"
)

func allAssigned(n int) runtime.Assignments {
	a := runtime.Assignments{}
	for i := 1; i <= n; i++ {
		a[runtime.SlotName(i)] = domain.PoolSharedDefault
	}
	return a
}

// waitAccept dials until the port accepts (bounded).
func waitAccept(b *testing.B, port int) {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s never accepted", addr)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// BenchmarkColdStart: supervisor start to all 8 assigned cells ready.
func BenchmarkColdStart(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		// newHarness times Run→Ready itself; the layout work is untimed.
		h := prepareHarness(b, 8)
		b.StartTimer()
		h.start()
		b.StopTimer()
		h.stop()
		b.StartTimer()
	}
}

// BenchmarkColdStartFloor: the same 8 nginx started directly, no supervisor,
// until every one serves its readiness probe (what "ready" means to the
// supervisor).
func BenchmarkColdStartFloor(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		h := prepareHarness(b, 8)
		b.StartTimer()
		var cmds []*exec.Cmd
		for _, s := range h.topo.Slots {
			cmds = append(cmds, bareStart(b, h.bin, s))
		}
		for _, s := range h.topo.Slots {
			waitServe(b, s.HTTPPort)
		}
		b.StopTimer()
		for _, c := range cmds {
			bareStop(c)
		}
		b.StartTimer()
	}
}

func bareStart(b *testing.B, bin string, s runtime.Slot) *exec.Cmd {
	// As the supervisor does: a killed master's socket would fail the bind.
	os.Remove(s.PrivateSocket())
	cmd := exec.Command(bin, "-p", s.Dir+"/", "-c", s.ConfPath(), "-e", s.LogsDir()+"/error.log")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// Its own process group outlives the test binary: stop it even when the
	// benchmark fails half-way.
	b.Cleanup(func() { bareStop(cmd) })
	return cmd
}

// bareStop kills a bare nginx's process group and reaps the master; a second
// call is harmless.
func bareStop(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	_ = cmd.Wait()
}

// BenchmarkExecToListenFloor: one bare nginx, exec to its port accepting.
func BenchmarkExecToListenFloor(b *testing.B) { benchBareStart(b, waitAccept) }

// BenchmarkExecToServeFloor: one bare nginx, exec until a worker answers
// the readiness probe (what the supervisor's "ready" means).
func BenchmarkExecToServeFloor(b *testing.B) { benchBareStart(b, waitServe) }

// benchBareStart times a bare nginx from exec until wait returns for its port.
func benchBareStart(b *testing.B, wait func(*testing.B, int)) {
	h := prepareHarness(b, 1)
	s := h.topo.Slots[0]
	var took []time.Duration
	for b.Loop() {
		t0 := time.Now()
		cmd := bareStart(b, h.bin, s)
		wait(b, s.HTTPPort)
		took = append(took, time.Since(t0))
		b.StopTimer()
		bareStop(cmd)
		b.StartTimer()
	}
	reportMedian(b, took)
}

// waitServe polls until a worker answers the readiness probe (bounded).
func waitServe(b *testing.B, port int) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _, err := get(port, "/.cellvisor/ready"); err == nil && code == 200 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("port %d never served", port)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// BenchmarkCrashToReady: kill -9 of a cell's master alone, and of master and
// worker together. Two medians: until the port accepts again on the new
// master (ms-median-accept; beside BenchmarkExecToListenFloor), and until
// the new cell is ready, a worker answering (ms-median; beside
// BenchmarkExecToServeFloor).
func BenchmarkCrashToReady(b *testing.B) {
	for _, mode := range []string{"master", "master+worker"} {
		b.Run(mode, func(b *testing.B) {
			h := prepareHarness(b, 1)
			h.start()
			g, err := h.cg.Open("cell-01")
			if err != nil {
				b.Fatal(err)
			}
			var took, accept []time.Duration
			for b.Loop() {
				b.StopTimer()
				st := h.slot("cell-01")
				victims := []int{st.PID}
				if mode == "master+worker" {
					victims, _ = g.Procs()
				}
				b.StartTimer()
				t0 := time.Now()
				for _, pid := range victims {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				// A new master is started only after the old cell's
				// leftovers (an orphaned worker holding the port) are dead:
				// from then on, an accepting port is the new master's.
				awaitNewPID(b, h, st.PID)
				waitAccept(b, st.HTTPPort)
				accept = append(accept, time.Since(t0))
				awaitNewReady(b, h, st.PID)
				took = append(took, time.Since(t0))
			}
			reportMedian(b, took)
			slices.Sort(accept)
			b.ReportMetric(float64(accept[len(accept)/2])/float64(time.Millisecond), "ms-median-accept")
		})
	}
}

// awaitSlot polls cell-01's status until ok holds for it (bounded).
func awaitSlot(b *testing.B, h *harness, what string, ok func(supervisor.SlotStatus) bool) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := h.slot("cell-01")
		if ok(s) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: %+v", what, s)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func awaitNewPID(b *testing.B, h *harness, old int) {
	awaitSlot(b, h, "no new master", func(s supervisor.SlotStatus) bool { return s.PID != old && s.PID != 0 })
}

func awaitNewReady(b *testing.B, h *harness, old int) {
	awaitSlot(b, h, "not ready again", func(s supervisor.SlotStatus) bool {
		return s.State == supervisor.StateReady && s.PID != old && s.PID != 0
	})
}

// BenchmarkDrain: the drain command to the readiness probe answering 503,
// as a prober polling it sees it (ms-median), and to the command's return,
// which also persists the state and reloads the cell (sec/op).
func BenchmarkDrain(b *testing.B) {
	h := layoutHarness(b, harnessOpts{slots: 1, assign: allAssigned(1)})
	h.start()
	port := h.topo.Slots[0].HTTPPort
	var took []time.Duration
	for b.Loop() {
		seen := make(chan time.Time, 1)
		stop := make(chan struct{})
		go func() { // a load balancer's probe, as fast as it can go
			for {
				select {
				case <-stop:
					return
				default:
				}
				if code, _, err := get(port, "/.cellvisor/ready"); err == nil && code == 503 {
					seen <- time.Now()
					return
				}
			}
		}()
		t0 := time.Now()
		if _, err := h.sup.Drain(context.Background(), "cell-01"); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		select {
		case at := <-seen:
			took = append(took, at.Sub(t0))
		case <-time.After(10 * time.Second):
			b.Fatal("readiness never answered 503")
		}
		close(stop)
		if _, err := h.sup.Undrain(context.Background(), "cell-01"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	reportMedian(b, took)
}

// BenchmarkRestart: the restart command (no request in flight) to the new
// cell ready.
func BenchmarkRestart(b *testing.B) {
	h := layoutHarness(b, harnessOpts{slots: 1, assign: allAssigned(1), limit: 1 << 30})
	h.start()
	var took []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := h.sup.Restart(context.Background(), "cell-01"); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	reportMedian(b, took)
}

// reportMedian adds the median of the samples as ms-median.
func reportMedian(b *testing.B, took []time.Duration) {
	if len(took) == 0 {
		return
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2])/float64(time.Millisecond), "ms-median")
}
