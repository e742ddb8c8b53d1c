package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cellvisor/domain"
	"cellvisor/internal/procstat"
	"cellvisor/testkit/testutil"
)

// BenchmarkServeVsNginx runs the same routes through a real cell and
// through one hand-written nginx (an upstream block with a keepalive pool,
// return for the fixed answer, proxy_cache for the cached route), one
// worker each, in the same run, and reports the serving worker's CPU per
// request and the requests per second: an origin route, a respond route
// and a cache hit. The cell runs in its cgroup at its 0.5 CPU limit, so
// its requests per second are what one cell carries; the hand-written
// nginx is not limited.
func BenchmarkServeVsNginx(b *testing.B) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "from the origin, a page of modest size\n")
	}))
	b.Cleanup(origin.Close)
	doms := []domain.Domain{{
		Domain: testHost, Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{testHost},
		Origins: []domain.Origin{{Name: "app", URL: origin.URL}},
		Routes: []domain.Route{
			{Prefix: "/", Origin: "app"},
			{Prefix: "/static", Respond: &domain.Response{Status: 200, Body: "static"}},
		},
	}, {
		Domain: "cached.test", Pool: domain.PoolSharedDefault, Revision: 1, Hostnames: []string{"cached.test"},
		Origins: []domain.Origin{{Name: "app", URL: origin.URL}},
		Routes:  []domain.Route{{Prefix: "/", Origin: "app"}},
		Cache:   &domain.Cache{TTLSeconds: 3600},
	}}
	h := newHarness(b, harnessOpts{slots: 1, domains: doms})
	cellPort := h.waitReady("cell-01", 0).HTTPPort
	cellWorker := cellStatus(b, privateClient(b, h, "cell-01", nil)).WorkerPID
	ngxPort, ngxWorker := handWritten(b, h.bin, strings.TrimPrefix(origin.URL, "http://"))

	routes := []struct{ name, host, path string }{
		{"origin", testHost, "/page"},
		{"respond", testHost, "/static"},
		{"cache-hit", "cached.test", "/page"},
	}
	for _, r := range routes {
		for _, side := range []struct {
			name   string
			port   int
			worker int
		}{{"cell", cellPort, cellWorker}, {"nginx", ngxPort, ngxWorker}} {
			b.Run(r.name+"/"+side.name, func(b *testing.B) {
				loadRoute(b, side.port, r.host, r.path, 16) // warm: the pool, the cache
				cpu0 := workerCPU(b, side.worker)
				t0 := time.Now()
				b.ResetTimer()
				loadRoute(b, side.port, r.host, r.path, b.N)
				b.StopTimer()
				took := time.Since(t0)
				cpu := workerCPU(b, side.worker) - cpu0
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "worker-µs/req")
				b.ReportMetric(float64(b.N)/took.Seconds(), "req/s")
			})
		}
	}
}

// loadRoute sends n requests over 8 kept-alive connections and fails on any
// answer but 200.
func loadRoute(b *testing.B, port int, host, path string, n int) {
	tr := &http.Transport{MaxIdleConnsPerHost: 8, MaxConnsPerHost: 8}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://127.0.0.1:" + strconv.Itoa(port) + path
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	per := (n + 7) / 8
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Host = host
				resp, err := c.Do(req)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("%s%s: %d", host, path, resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// workerCPU is a process's user and system CPU time.
func workerCPU(b *testing.B, pid int) time.Duration {
	f, err := procstat.Fields(pid)
	if err != nil {
		b.Fatal(err)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// handWritten starts one nginx worker serving what the cell serves, the
// way an operator would write it by hand, and returns its port and its
// worker's pid.
func handWritten(b *testing.B, bin, origin string) (int, int) {
	return startNginx(b, bin, func(root string, port int) string {
		return fmt.Sprintf(`events { worker_connections 1024; }
http {
    access_log %[1]s/access.log;
    proxy_temp_path %[1]s/tmp;
    client_body_temp_path %[1]s/tmp;
    proxy_cache_path %[1]s/cache levels=1:2 keys_zone=hw:10m;
    upstream origin { server %[2]s; keepalive 64; }
    server {
        listen 127.0.0.1:%[3]d;
        server_name %[4]s;
        location /static { default_type text/plain; return 200 "static\n"; }
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
        }
    }
    server {
        listen 127.0.0.1:%[3]d;
        server_name cached.test;
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_cache hw;
            proxy_cache_valid 200 1h;
        }
    }
}
`, root, origin, port, testHost)
	})
}

// startNginx starts one bare nginx worker (the host's binary and modules)
// with the configuration conf writes for its root directory and port (the
// events and http blocks), and returns its port and its worker's pid.
func startNginx(b *testing.B, bin string, conf func(root string, port int) string) (int, int) {
	root := b.TempDir()
	testutil.Traversable(b, root) // its workers may run as another user (nobody, under root)
	for _, d := range []string{"cache", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o777); err != nil {
			b.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(root, d), 0o777); err != nil {
			b.Fatal(err)
		}
	}
	port := testutil.PortBase(b, 1)
	_, mods := testutil.RequireOpenResty(b)
	var text strings.Builder
	for _, m := range mods {
		fmt.Fprintf(&text, "load_module %s;\n", m)
	}
	fmt.Fprintf(&text, "daemon off;\nworker_processes 1;\npid %[1]s/nginx.pid;\nerror_log %[1]s/error.log warn;\n", root)
	text.WriteString(conf(root, port))
	confPath := filepath.Join(root, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(text.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", root+"/", "-c", confPath, "-e", root+"/error.log")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bareStop(cmd) })
	var worker int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for worker == 0 {
		if ctx.Err() != nil {
			b.Fatal("the hand-written nginx started no worker")
		}
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				if cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cl), "worker process") {
					worker = pid
				}
			}
		}
		time.Sleep(time.Millisecond) // polling the process table, bounded by ctx
	}
	waitAccept(b, port)
	return port, worker
}
