// Command mkpkg builds the cellvisor and cellvisor-control deb and rpm
// packages (`make packages`): the version comes from git describe, made valid
// for deb and rpm, unless --version gives one.
//
//	mkpkg [--root .] [--bindir bin] [--out dist] [--version X.Y.Z[~PRE][+META]] [--arch GOARCH]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"cellvisor/packaging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "mkpkg:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mkpkg", flag.ContinueOnError)
	root := fs.String("root", ".", "the repository's root (packaging/ is under it)")
	binDir := fs.String("bindir", "bin", "directory of the built cellvisor and cellvisor-control binaries")
	out := fs.String("out", "dist", "directory the packages are written to")
	version := fs.String("version", "", "package version X.Y.Z[~PRE][+META]; empty: from git describe")
	release := fs.String("release", "1", "package release (deb revision, rpm Release)")
	arch := fs.String("arch", "", "GOARCH of the binaries; empty: this program's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var v packaging.Version
	var err error
	if *version != "" {
		v, err = packaging.ParseVersion(*version)
	} else {
		v, err = gitVersion(ctx, *root)
	}
	if err != nil {
		return err
	}
	paths, err := packaging.Build(packaging.Options{
		Root: *root, BinDir: *binDir, OutDir: *out, Version: v, Release: *release, Arch: *arch,
	})
	for _, p := range paths {
		fmt.Println(p)
	}
	return err
}

// gitVersion runs git describe (and, with no tag, counts the commits).
func gitVersion(ctx context.Context, root string) (packaging.Version, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	describe, err := git(ctx, root, "describe", "--tags", "--long", "--always", "--dirty", "--abbrev=12")
	if err != nil {
		return packaging.Version{}, err
	}
	count, err := git(ctx, root, "rev-list", "--count", "HEAD")
	if err != nil {
		return packaging.Version{}, err
	}
	n, err := strconv.Atoi(count)
	if err != nil {
		return packaging.Version{}, fmt.Errorf("git rev-list --count: %q: %w", count, err)
	}
	return packaging.ParseDescribe(describe, n)
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(b)), nil
}
