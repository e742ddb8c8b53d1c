// Command vmload is the VM test's request load (scripts/vm): it sends HTTP
// requests to the cells on the guest's loopback until it is told to stop
// (SIGTERM, SIGINT) or its --duration ends, counts the answers that were
// what was expected and the ones that were not, and writes the counts.
//
//	vmload --target HOST=URL [--target ...] [--expect 200] [--body TEXT]
//	       [--workers 2] [--pause 20ms] [--timeout 2s] [--duration 0] [--out FILE]
//
// Each worker goes round the targets in turn, one request at a time, each on
// a new connection (no keep-alive: a connection the cells' listeners no
// longer accept is seen). The counts go to --out as one JSON object
// {"ok":N,"failed":M,"errors":[...]} (the first 20 failures, with their
// time) and to stdout as "vmload ok=N failed=M".
//
// Built static (CGO_ENABLED=0) by scripts/vm/run and copied onto the VM's
// payload disk.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

type target struct {
	host string
	url  string
}

type targets []target

func (t *targets) String() string { return fmt.Sprint(*t) }

func (t *targets) Set(s string) error {
	host, url, ok := strings.Cut(s, "=")
	if !ok || host == "" || !strings.HasPrefix(url, "http://") {
		return fmt.Errorf("want HOST=http://..., got %q", s)
	}
	*t = append(*t, target{host: host, url: url})
	return nil
}

type result struct {
	OK     int64    `json:"ok"`
	Failed int64    `json:"failed"`
	Errors []string `json:"errors"`
}

type counter struct {
	mu  sync.Mutex
	res result
}

func (c *counter) ok() {
	c.mu.Lock()
	c.res.OK++
	c.mu.Unlock()
}

func (c *counter) fail(t target, err error) {
	c.mu.Lock()
	c.res.Failed++
	if len(c.res.Errors) < 20 {
		c.res.Errors = append(c.res.Errors, fmt.Sprintf("%s %s (Host %s): %v", time.Now().Format("15:04:05.000"), t.url, t.host, err))
	}
	c.mu.Unlock()
}

func main() {
	var ts targets
	flag.Var(&ts, "target", "HOST=URL to request (repeatable)")
	expect := flag.Int("expect", 200, "the expected status")
	body := flag.String("body", "", "text the answer's body must contain (empty: any)")
	workers := flag.Int("workers", 2, "concurrent requests")
	pause := flag.Duration("pause", 20*time.Millisecond, "pause between two requests of one worker")
	timeout := flag.Duration("timeout", 2*time.Second, "one request's deadline")
	duration := flag.Duration("duration", 0, "stop after this long (0: at SIGTERM or SIGINT)")
	out := flag.String("out", "", "file the JSON counts are written to")
	flag.Parse()
	if len(ts) == 0 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "vmload: at least one --target and one worker")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext:       (&net.Dialer{Timeout: *timeout}).DialContext,
		},
	}
	var c counter
	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i++ {
				t := ts[i%len(ts)]
				// A request in flight is finished even when the stop comes:
				// its outcome counts.
				if err := request(client, t, *expect, *body); err != nil {
					c.fail(t, err)
				} else {
					c.ok()
				}
				select {
				case <-ctx.Done():
				case <-time.After(*pause):
				}
			}
		}(w)
	}
	wg.Wait()

	c.mu.Lock()
	res := c.res
	c.mu.Unlock()
	if res.Errors == nil {
		res.Errors = []string{}
	}
	if *out != "" {
		b, err := json.Marshal(res)
		if err == nil {
			err = os.WriteFile(*out+".tmp", append(b, '\n'), 0o644)
		}
		if err == nil {
			err = os.Rename(*out+".tmp", *out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "vmload:", err)
			os.Exit(1)
		}
	}
	fmt.Printf("vmload ok=%d failed=%d\n", res.OK, res.Failed)
}

func request(client *http.Client, t target, expect int, want string) error {
	req, err := http.NewRequest(http.MethodGet, t.url, nil)
	if err != nil {
		return err
	}
	req.Host = t.host
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("status %d, body: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != expect {
		return fmt.Errorf("status %d, want %d: %.80q", resp.StatusCode, expect, b)
	}
	if want != "" && !strings.Contains(string(b), want) {
		return fmt.Errorf("status %d, body lacks %q", resp.StatusCode, want)
	}
	return nil
}
