package outbound

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// TestMeasureIntakeFloodRSS measures what a flood of silent connections
// costs the process serving an intake: CELLVISOR_FLOOD_MEASURE=<n> runs
// it (it skips otherwise), with CELLVISOR_FLOOD_UNBOUNDED=1 serving the
// intake as it was before issue 32 (http.Server.ServeTLS on the raw
// listener). The flood comes from a child process (this test binary), so
// its client ends cost this process nothing:
//
//	CELLVISOR_FLOOD_MEASURE=12000 go test -count=1 -run TestMeasureIntakeFloodRSS -v ./outbound/
func TestMeasureIntakeFloodRSS(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CELLVISOR_FLOOD_MEASURE"))
	if n <= 0 {
		t.Skip("set CELLVISOR_FLOOD_MEASURE=<connections> to measure")
	}
	unbounded := os.Getenv("CELLVISOR_FLOOD_UNBOUNDED") == "1"
	e := newEnv(t, time.Minute)
	var cl *countingListener
	a := e.startEdge("edge-a", org, edgeOpts{noIntake: unbounded, wrap: func(ln net.Listener) net.Listener { cl = newCountingListener(ln); return cl }})
	addr := a.ln.Addr().String()
	if unbounded {
		ln, err := net.Listen("tcp", addr) // noIntake closed it
		if err != nil {
			t.Fatal(err)
		}
		cl = newCountingListener(ln)
		srv := &http.Server{Handler: NewIntake(a.sender), TLSConfig: a.sender.o.TLS.ServerConfig(), ReadHeaderTimeout: 5 * time.Second}
		go srv.ServeTLS(cl, "", "")
		t.Cleanup(func() { srv.Close() })
	}
	rss0 := rss(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFloodHelper$")
	child.Env = append(os.Environ(), "CELLVISOR_FLOOD_ADDR="+addr, fmt.Sprintf("CELLVISOR_FLOOD_N=%d", n))
	stdin, _ := child.StdinPipe()
	out, _ := child.StdoutPipe()
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); child.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "flooding") {
	}
	testutil.Eventually(t, time.Minute, func() error {
		if accepted, _, _, _ := cl.counts(); accepted < n {
			return fmt.Errorf("%d of %d taken", accepted, n)
		}
		return nil
	})
	peakRSS := rss(t)
	_, live, peak, _ := cl.counts()
	t.Logf("unbounded=%v: a flood of %d silent connections: %d held (peak %d); RSS %d -> %d MiB (+%d MiB)", unbounded, n, live, peak,
		rss0>>20, peakRSS>>20, (peakRSS-rss0)>>20)
}

// TestFloodHelper is the flood's child process: it opens
// CELLVISOR_FLOOD_N connections to CELLVISOR_FLOOD_ADDR from 127.0.0.2–9
// and holds them until its stdin closes.
func TestFloodHelper(t *testing.T) {
	addr := os.Getenv("CELLVISOR_FLOOD_ADDR")
	n, _ := strconv.Atoi(os.Getenv("CELLVISOR_FLOOD_N"))
	if addr == "" || n <= 0 {
		t.Skip("the flood measurement's child process")
	}
	var conns []net.Conn
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%8))}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	fmt.Println("flooding")
	_, err := bufio.NewReader(os.Stdin).ReadByte()
	if err != nil && !errors.Is(err, os.ErrClosed) {
		t.Log(err)
	}
	for _, c := range conns {
		c.Close()
	}
}

// rss is this process's resident set.
func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
