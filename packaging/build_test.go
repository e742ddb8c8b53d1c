package packaging

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cellvisor/cgexec"
)

// scratch holds binaries and packages built once per version for every test
// of the run (TestMain removes it).
var scratch string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cellvisor-packaging-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	scratch = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	builtMu sync.Mutex
	built   = map[string]map[string]string{} // version → "name format" → path
)

// packagesFor builds both binaries (their version set to version, as make
// build does) and, with mkpkg, the four packages of version, once per run,
// and returns the packages by "name format".
func packagesFor(t *testing.T, version string) map[string]string {
	t.Helper()
	builtMu.Lock()
	defer builtMu.Unlock()
	if p, ok := built[version]; ok {
		return p
	}
	v, err := ParseVersion(version)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("needs the go command to build the binaries: %v", err)
	}
	dir := filepath.Join(scratch, version)
	binDir := filepath.Join(dir, "bin")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gobuild := func(out, pkg string, ldflags string) {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", out, pkg)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0") // static, as make build builds them
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	for _, name := range Packages {
		ldflags := "-s -w -X cellvisor/agent.Version=" + v.String()
		if name == "cellvisor" {
			ldflags += " " + cgexec.LDFlags() // as make build links the agent
		}
		gobuild(filepath.Join(binDir, name), "./cmd/"+name, ldflags)
	}
	// The packages are built by mkpkg, as make packages does: that tests its
	// flags too, and keeps nfpm's compression out of the race detector.
	mkpkg := filepath.Join(scratch, "mkpkg")
	if _, err := os.Stat(mkpkg); err != nil {
		gobuild(mkpkg, "./packaging/cmd/mkpkg", "")
	}
	cmd := exec.CommandContext(ctx, mkpkg, "--root", "..", "--bindir", binDir, "--out", filepath.Join(dir, "dist"), "--version", version)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mkpkg: %v\n%s", err, stderr.String())
	}
	paths := strings.Fields(string(out))
	if len(paths) != len(Packages)*len(Formats) {
		t.Fatalf("mkpkg wrote %d packages, want %d: %q", len(paths), len(Packages)*len(Formats), paths)
	}
	byKey := map[string]string{}
	for _, p := range paths {
		base := filepath.Base(p)
		name := "cellvisor"
		if strings.HasPrefix(base, "cellvisor-control") {
			name = "cellvisor-control"
		}
		byKey[name+" "+strings.TrimPrefix(filepath.Ext(p), ".")] = p
	}
	built[version] = byKey
	return byKey
}

// command runs name with args (bounded) and returns its standard output.
func command(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func requireTool(t *testing.T, name, why string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("needs %s %s (make deps installs it on Debian): %v", name, why, err)
	}
}

func TestBuildRefusesBadOptions(t *testing.T) {
	good := Options{Root: "..", BinDir: t.TempDir(), OutDir: t.TempDir(), Version: Version{Base: "1.0.0"}}
	for name, mod := range map[string]func(*Options){
		"no root":     func(o *Options) { o.Root = "" },
		"bad version": func(o *Options) { o.Version = Version{Base: "v1"} },
		"no binaries": func(*Options) {},
		"unknown pkg": func(o *Options) { o.Packages = []string{"nope"} },
	} {
		t.Run(name, func(t *testing.T) {
			o := good
			mod(&o)
			if paths, err := Build(o); err == nil {
				t.Fatalf("Build succeeded: %q", paths)
			}
			if left, _ := filepath.Glob(filepath.Join(o.OutDir, "*")); len(left) != 0 && o.OutDir != "" {
				t.Errorf("a failed build left %q", left)
			}
		})
	}
}
