package runtimebin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/runtimebin"
	"cellvisor/testkit/testutil"
)

func TestVersionOfTheHostsBinary(t *testing.T) {
	bin, _ := testutil.RequireOpenResty(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := runtimebin.Version(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "nginx/") && !strings.HasPrefix(v, "openresty/") {
		t.Errorf("version %q, want nginx/… or openresty/…", v)
	}
}

// script writes an executable shell script.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVersionAndTestOfScripts(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, body, want string
		err              error
	}{
		{"nginx", `echo "nginx version: nginx/1.25.3" >&2`, "nginx/1.25.3", nil},
		{"openresty", `echo "nginx version: openresty/1.25.3.1" >&2; echo "built by gcc" >&2`, "openresty/1.25.3.1", nil},
		{"silent", `exit 0`, "", runtimebin.ErrVersion},
		{"failing", `echo boom >&2; exit 1`, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := runtimebin.Version(ctx, script(t, dir, tc.name, tc.body))
			switch {
			case tc.want != "" && (err != nil || v != tc.want):
				t.Errorf("version %q %v, want %q", v, err, tc.want)
			case tc.want == "" && err == nil:
				t.Errorf("version %q, want an error", v)
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Errorf("error %v, want %v", err, tc.err)
			}
		})
	}
	bad := runtimebin.Test{Binary: script(t, dir, "refuses", `echo "nginx: [emerg] module is not binary compatible" >&2; exit 1`),
		Prefix: dir, Conf: "/nonexistent.conf", ErrorLog: os.DevNull}
	err := bad.Run(ctx)
	if !errors.Is(err, runtimebin.ErrTest) || !strings.Contains(err.Error(), "not binary compatible") {
		t.Errorf("refused test: %v, want ErrTest with the binary's message", err)
	}
	ok := bad
	ok.Binary = script(t, dir, "accepts", `exit 0`)
	if err := ok.Run(ctx); err != nil {
		t.Errorf("accepted test: %v", err)
	}
	hang := bad
	hang.Binary = script(t, dir, "hangs", `sleep 60`)
	sctx, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer scancel()
	if err := hang.Run(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hanging test: %v, want the context's deadline", err)
	}
}

// A file renamed over the path (as a package upgrade installs one) has
// another identity; the same file stat'ed again has the same.
func TestStatTellsAReplacedFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "nginx")
	if err := os.WriteFile(p, []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	a, err := runtimebin.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := runtimebin.Stat(p); b != a {
		t.Errorf("the same file: %+v then %+v", a, b)
	}
	if err := os.WriteFile(p+".new", []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	if b, _ := runtimebin.Stat(p); b == a {
		t.Errorf("a file renamed over the path has the old identity %+v", b)
	}
}
