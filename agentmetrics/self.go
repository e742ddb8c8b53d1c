package agentmetrics

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"cellvisor/internal/procstat"
)

// The agent process's own series, named as Prometheus's Go client names
// them (go_*, process_*), so that dashboards for Go processes read them.

var (
	goGoroutines = &Desc{name: "go_goroutines", help: "Number of goroutines that currently exist."}
	goThreads    = &Desc{name: "go_threads", help: "Number of OS threads created."}
	goInfo       = &Desc{name: "go_info", help: "Information about the Go environment.", labels: []string{"version"}}
	goGC         = &Desc{name: "go_gc_duration_seconds", help: "A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles."}
	goAlloc      = &Desc{name: "go_memstats_alloc_bytes", help: "Number of heap bytes allocated and currently in use."}
	goSys        = &Desc{name: "go_memstats_sys_bytes", help: "Number of bytes obtained from system."}
	goHeapInuse  = &Desc{name: "go_memstats_heap_inuse_bytes", help: "Number of heap bytes that are in use."}
	goHeapObj    = &Desc{name: "go_memstats_heap_objects", help: "Number of currently allocated objects."}
	goNextGC     = &Desc{name: "go_memstats_next_gc_bytes", help: "Number of heap bytes when next garbage collection will take place."}
	goLastGC     = &Desc{name: "go_memstats_last_gc_time_seconds", help: "Number of seconds since 1970 of last garbage collection."}
	goMallocs    = &Desc{name: "go_memstats_mallocs_total", help: "Total number of heap objects allocated."}
	goFrees      = &Desc{name: "go_memstats_frees_total", help: "Total number of heap objects frees."}

	procCPU   = &Desc{name: "process_cpu_seconds_total", help: "Total user and system CPU time spent in seconds."}
	procRSS   = &Desc{name: "process_resident_memory_bytes", help: "Resident memory size in bytes."}
	procVSize = &Desc{name: "process_virtual_memory_bytes", help: "Virtual memory size in bytes."}
	procStart = &Desc{name: "process_start_time_seconds", help: "Start time of the process since unix epoch in seconds."}
	procFDs   = &Desc{name: "process_open_fds", help: "Number of open file descriptors."}
	procMaxFD = &Desc{name: "process_max_fds", help: "Maximum number of open file descriptors."}
)

// runtimeCollector sends the Go runtime's figures.
type runtimeCollector struct{}

func (runtimeCollector) Describe() []*Desc {
	return []*Desc{goGoroutines, goThreads, goInfo, goGC, goAlloc, goSys, goHeapInuse, goHeapObj, goNextGC, goLastGC, goMallocs, goFrees}
}

func (runtimeCollector) Collect(emit func(sample)) {
	gauge(emit, goGoroutines, float64(runtime.NumGoroutine()))
	threads, _ := runtime.ThreadCreateProfile(nil)
	gauge(emit, goThreads, float64(threads))
	gauge(emit, goInfo, 1, runtime.Version())
	gc := debug.GCStats{PauseQuantiles: make([]time.Duration, 5)}
	debug.ReadGCStats(&gc)
	for i, q := range []string{"0", "0.25", "0.5", "0.75", "1"} {
		emit(sample{d: goGC, kind: summaryKind, values: []string{q}, v: gc.PauseQuantiles[i].Seconds()})
	}
	emit(sample{d: goGC, kind: summaryKind, suffix: "_sum", v: gc.PauseTotal.Seconds()})
	emit(sample{d: goGC, kind: summaryKind, suffix: "_count", v: float64(gc.NumGC)})
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	gauge(emit, goAlloc, float64(m.Alloc))
	gauge(emit, goSys, float64(m.Sys))
	gauge(emit, goHeapInuse, float64(m.HeapInuse))
	gauge(emit, goHeapObj, float64(m.HeapObjects))
	gauge(emit, goNextGC, float64(m.NextGC))
	gauge(emit, goLastGC, float64(m.LastGC)/1e9)
	counter(emit, goMallocs, float64(m.Mallocs))
	counter(emit, goFrees, float64(m.Frees))
}

// processCollector sends the process's figures from /proc/self. A figure
// that cannot be read is left out of the scrape.
type processCollector struct{}

func (processCollector) Describe() []*Desc {
	return []*Desc{procCPU, procRSS, procVSize, procStart, procFDs, procMaxFD}
}

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// Linux architecture the agent is built for.
const userHZ = 100

func (processCollector) Collect(emit func(sample)) {
	if f, err := procstat.Fields(os.Getpid()); err == nil {
		field := func(n int) float64 { // n: the field's number in proc(5)
			v, _ := strconv.ParseInt(f[n-3], 10, 64)
			return float64(v)
		}
		counter(emit, procCPU, (field(14)+field(15))/userHZ)
		gauge(emit, procRSS, field(24)*float64(os.Getpagesize()))
		gauge(emit, procVSize, field(23))
		if boot, err := bootTime(); err == nil {
			gauge(emit, procStart, float64(boot)+field(22)/userHZ)
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		gauge(emit, procFDs, float64(len(fds)))
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil {
		gauge(emit, procMaxFD, float64(lim.Cur))
	}
}

// bootTime is the host's boot time, Unix seconds (/proc/stat's btime),
// read once: it does not change while the host runs.
var bootTime = sync.OnceValues(func() (int64, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(data) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			return strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, os.ErrNotExist
})
