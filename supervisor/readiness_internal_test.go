package supervisor

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveOnce answers every connection on a loopback listener with answer
// (after reading the request's head), or never when answer is "".
func serveOnce(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				r := bufio.NewReader(conn)
				for {
					line, err := r.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				if answer == "" {
					_, _ = r.ReadByte() // until the client gives up
					return
				}
				_, _ = conn.Write([]byte(answer))
			}()
		}
	}()
	return ln.Addr().String()
}

// askReady reads the status line alone: 200 and 503 are answers, anything
// else is an error that says what came, and a silent cell is ctx's end.
func TestAskReady(t *testing.T) {
	for _, tc := range []struct {
		name, answer, wantErr string
	}{
		{"ready", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", ""},
		{"drained", "HTTP/1.1 503 Service Unavailable\r\n\r\n", ""},
		{"failing", "HTTP/1.1 500 Internal Server Error\r\n\r\n", "readiness answered 500 Internal Server Error"},
		{"not http", "SSH-2.0-OpenSSH\r\n", "not HTTP"},
		{"endless line", "HTTP/1.1 200 " + strings.Repeat("x", 1000) + "\r\n", "status line"},
		{"silent", "", "deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveOnce(t, tc.answer)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := askReady(ctx, addr)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("askReady: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("askReady: %v, want an error with %q", err, tc.wantErr)
			}
			if tc.answer == "" && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("askReady on a silent cell: %v, want the context's deadline", err)
			}
		})
	}
}

// A liveness check tells an overloaded cell (it accepts and closes at once)
// from a hung one (it does not answer within the timeout) and from one that
// does not listen.
func TestCheckAliveTellsOverloadFromAHang(t *testing.T) {
	serve := func(t *testing.T, handle func(net.Conn)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go handle(c)
			}
		}()
		return ln.Addr().String()
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	closes := serve(t, func(c net.Conn) { c.Close() })
	silent := serve(t, func(c net.Conn) { <-done; c.Close() })
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	nobody := ln.Addr().String()
	ln.Close()
	ctx := context.Background()
	if err := checkAlive(ctx, closes, time.Second); !errors.Is(err, errOverloaded) {
		t.Errorf("accepted and closed at once: %v, want overloaded", err)
	}
	if err := checkAlive(ctx, silent, 200*time.Millisecond); err == nil || errors.Is(err, errOverloaded) {
		t.Errorf("accepted, no answer: %v, want a failure that is not overload", err)
	}
	if err := checkAlive(ctx, nobody, time.Second); err == nil || errors.Is(err, errOverloaded) {
		t.Errorf("nothing listening: %v, want a failure that is not overload", err)
	}
}
