package controlapi_test

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"cellvisor/testkit/testutil"
)

// controlProc is a `cellvisor-control serve` child process on loopback,
// with its own data directory: the fleet load's control API when the
// simulated edges would not fit in one process with it (each edge is one
// socket on either side).
type controlProc struct {
	cmd          *exec.Cmd
	exited       chan struct{} // closed once Wait returned
	waitErr      error         // set before exited is closed
	edgeURL      string
	adminURL     string
	adminToken   string
	metricsToken string
	roots        *x509.CertPool
	hc           *http.Client // for the metrics scrapes
	logPath      string
}

// buildControl builds cmd/cellvisor-control into dir.
func buildControl(tb testing.TB, dir string) string {
	bin := filepath.Join(dir, "cellvisor-control")
	if err := testutil.GoBuild("cellvisor/cmd/cellvisor-control", bin); err != nil {
		tb.Fatal(err)
	}
	return bin
}

// startControl runs bin serve on dsn (a postgres:// URL, or a SQLite file
// for the data directory's default) until the test's cleanup, which stops
// it with SIGTERM (SIGKILL after 20 s) and reaps it. It returns once the
// child logged its endpoints.
func startControl(tb testing.TB, bin, dsn string) *controlProc {
	data := tb.TempDir()
	args := []string{"serve", "--data", data, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-format", "json"}
	if strings.HasPrefix(dsn, "postgres") {
		args = append(args, "--db", dsn)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	// The child's environment is the test's minus the control API's own
	// variables, which would override these flags' defaults.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CELLVISOR_CONTROL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	// Dies with the test process, should that be killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	p := &controlProc{cmd: cmd, exited: make(chan struct{}), logPath: filepath.Join(data, "serve.log")}
	logf, err := os.Create(p.logPath)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		logf.Close()
		tb.Fatalf("start %s: %v", bin, err)
	}
	ready := make(chan readyLine, 1)
	var logDone sync.WaitGroup
	logDone.Go(func() { scanServeLog(io.TeeReader(stderr, logf), ready) })
	go func() {
		logDone.Wait() // the pipe is read to its end before Wait closes it
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		cancel()
		<-p.exited
		// Wait reports the cancellation even after a clean exit: the exit
		// status is what tells.
		if ps := cmd.ProcessState; ps == nil || !ps.Success() {
			tb.Errorf("cellvisor-control serve did not stop cleanly on SIGTERM: %v (log: %s)", p.waitErr, p.tail())
		}
	})
	tm := time.NewTimer(time.Minute)
	defer tm.Stop()
	var rl readyLine
	select {
	case rl = <-ready:
	case <-p.exited:
		tb.Fatalf("cellvisor-control serve exited before it was ready: %v: %s", p.waitErr, p.tail())
	case <-tm.C:
		tb.Fatalf("cellvisor-control serve not ready within a minute: %s", p.tail())
	}
	p.edgeURL, p.adminURL = rl.EdgeAPI, rl.AdminAPI
	for _, f := range []struct {
		dst  *string
		name string
	}{{&p.adminToken, "admin.token"}, {&p.metricsToken, "metrics.token"}} {
		b, err := os.ReadFile(filepath.Join(data, f.name))
		if err != nil {
			tb.Fatal(err)
		}
		*f.dst = strings.TrimSpace(string(b))
	}
	ca, err := os.ReadFile(filepath.Join(data, "ca.pem"))
	if err != nil {
		tb.Fatal(err)
	}
	p.roots = x509.NewCertPool()
	if !p.roots.AppendCertsFromPEM(ca) {
		tb.Fatalf("%s/ca.pem: no certificate", data)
	}
	p.hc = &http.Client{Timeout: time.Minute}
	tb.Cleanup(p.hc.CloseIdleConnections)
	return p
}

// readyLine is serve's "ready" log entry.
type readyLine struct {
	Msg      string `json:"msg"`
	EdgeAPI  string `json:"edge_api"`
	AdminAPI string `json:"admin_api"`
}

// scanServeLog reads serve's JSON log to its end, sending the ready entry.
func scanServeLog(r io.Reader, ready chan<- readyLine) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sent := false
	for sc.Scan() {
		var l readyLine
		if !sent && json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "ready" {
			ready <- l
			sent = true
		}
	}
	io.Copy(io.Discard, r) // a line too long for the scanner: keep the child unblocked
}

// tail is the end of the child's log, for failure messages.
func (p *controlProc) tail() string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// warnings counts the child's log entries above info by level and
// message, so far.
func (p *controlProc) warnings() map[string]float64 {
	f, err := os.Open(p.logPath)
	if err != nil {
		return map[string]float64{"(log unreadable)": 1}
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l struct {
			Level  string `json:"level"`
			Logger string `json:"logger"`
			Msg    string `json:"msg"`
			Error  string `json:"error"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		// net/http's own complaints (handshakes, timeouts) come through a
		// standard logger at info.
		httpLog := strings.HasSuffix(l.Logger, "http")
		if !httpLog && (l.Level == "info" || l.Level == "debug") {
			continue
		}
		k := l.Level + " " + addrRE.ReplaceAllString(l.Msg, "ADDR")
		if l.Error != "" {
			k += ": " + errKind(errors.New(l.Error))
		}
		out[k]++
	}
	return out
}

var addrRE = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

// alive reports whether the child is still running.
func (p *controlProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// scrape reads /metrics over HTTP with the metrics token.
func (p *controlProc) scrape(ctx context.Context) ([]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.adminURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.metricsToken)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := p.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("scrape: HTTP %d: %s", resp.StatusCode, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

// procUsage is one process's CPU time and memory, from /proc.
type procUsage struct {
	cpu            float64 // user + system seconds
	rss, peakRSS   float64 // bytes: VmRSS, VmHWM
	threads, fdsIn int
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture (the kernel's HZ is hidden behind it).
const clockTicks = 100

func readProcUsage(pid int) (procUsage, error) {
	var u procUsage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one (field 3, the state, is rest[0]).
	i := strings.LastIndexByte(string(stat), ')')
	rest := strings.Fields(string(stat[i+1:]))
	if len(rest) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(rest))
	}
	utime, err1 := strconv.ParseFloat(rest[11], 64)
	stime, err2 := strconv.ParseFloat(rest[12], 64)
	if err := errors.Join(err1, err2); err != nil {
		return u, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	u.cpu = (utime + stime) / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseFloat(f[0], 64)
		switch k {
		case "VmRSS":
			u.rss = n * 1024
		case "VmHWM":
			u.peakRSS = n * 1024
		case "Threads":
			u.threads = int(n)
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		u.fdsIn = len(ents)
	}
	return u, nil
}

// TestReadProcUsage reads this process's figures as the fleet load reads
// the control API's: CPU time spent, resident memory and its peak.
func TestReadProcUsage(t *testing.T) {
	u0, err := readProcUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Spend CPU until the tick-granular counter moves (bounded).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var u1 procUsage
	for x := uint64(1); ; x = x*6364136223846793005 + 1 {
		if x%(1<<16) == 0 {
			if u1, err = readProcUsage(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			if u1.cpu > u0.cpu {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("CPU time stayed %g s for 10 s of spinning", u1.cpu)
			}
		}
	}
	if u1.rss <= 0 || u1.peakRSS < u1.rss || u1.threads < 1 || u1.fdsIn < 3 {
		t.Errorf("usage %+v: want a resident size, a peak at least as large, threads and open files", u1)
	}
	if _, err := readProcUsage(1 << 30); err == nil {
		t.Error("a PID that cannot exist: want an error")
	}
}

// TestHistDeltaParsedScrape: quantiles from a scraped (text-parsed)
// histogram, whose +Inf bucket is explicit, equal those from a gathered
// one, where it is implicit.
func TestHistDeltaParsedScrape(t *testing.T) {
	const text = `# TYPE cellvisor_control_http_request_duration_seconds histogram
cellvisor_control_http_request_duration_seconds_bucket{code="304",listener="edge",route="GET /v1/manifest",le="0.001"} 50
cellvisor_control_http_request_duration_seconds_bucket{code="304",listener="edge",route="GET /v1/manifest",le="0.01"} 99
cellvisor_control_http_request_duration_seconds_bucket{code="304",listener="edge",route="GET /v1/manifest",le="+Inf"} 100
cellvisor_control_http_request_duration_seconds_sum{code="304",listener="edge",route="GET /v1/manifest"} 0.5
cellvisor_control_http_request_duration_seconds_count{code="304",listener="edge",route="GET /v1/manifest"} 100
`
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	var after []*dto.MetricFamily
	for _, f := range fams {
		after = append(after, f)
	}
	h := histDelta(nil, after, "GET /v1/manifest")
	if got := h.counts[len(h.counts)-1]; got != 100 {
		t.Fatalf("total %g, want 100 (the +Inf bucket counted once)", got)
	}
	for _, tc := range []struct {
		q, want float64
	}{{0.5, 0.001}, {0.99, 0.01}, {0.995, 0.01}} {
		if got := h.quantile(tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("quantile(%g) = %g, want %g", tc.q, got, tc.want)
		}
	}
}
