// Package packaging builds the cellvisor and cellvisor-control deb and rpm
// packages with nfpm, from the nfpm configurations, maintainer scripts,
// sysusers.d and tmpfiles.d entries and default configuration files beside
// it. Only packaging/cmd/mkpkg and its tests import it: nothing of nfpm may
// reach the agent or the control API (internal/deptest).
package packaging

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // registers the rpm packager
)

// Packages are the packages built, each from packaging/<name>.yaml.
var Packages = []string{"cellvisor", "cellvisor-control"}

// Formats are the package formats built.
var Formats = []string{"deb", "rpm"}

// Options says what to build and from where.
type Options struct {
	// Root is the repository's root: the nfpm configurations' relative paths
	// start there. Required.
	Root string
	// BinDir holds the built cellvisor and cellvisor-control binaries.
	// Required.
	BinDir string
	// OutDir receives the packages; created if missing. Required.
	OutDir string
	// Version of every package. Required.
	Version Version
	// Release is the package release (deb revision, rpm Release), or empty
	// for "1".
	Release string
	// Arch is GOARCH of the binaries (nfpm maps it to each format's name),
	// or empty for the running program's.
	Arch string
	// Packages to build, or nil for Packages.
	Packages []string
	// Formats to build, or nil for Formats.
	Formats []string
}

// Build writes every requested package into o.OutDir and returns their paths.
func Build(o Options) ([]string, error) {
	if o.Root == "" || o.BinDir == "" || o.OutDir == "" {
		return nil, errors.New("build packages: Root, BinDir and OutDir are required")
	}
	if err := o.Version.Validate(); err != nil {
		return nil, fmt.Errorf("build packages: version: %w", err)
	}
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	if o.Release == "" {
		o.Release = "1"
	}
	if o.Packages == nil {
		o.Packages = Packages
	}
	if o.Formats == nil {
		o.Formats = Formats
	}
	binDir, err := filepath.Abs(o.BinDir)
	if err != nil {
		return nil, fmt.Errorf("build packages: %w", err)
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("build packages: %w", err)
	}
	var out []string
	for _, name := range o.Packages {
		cfg, err := loadConfig(o.Root, name, binDir)
		if err != nil {
			return out, err
		}
		for _, format := range o.Formats {
			path, err := buildOne(cfg, format, o)
			if err != nil {
				return out, fmt.Errorf("build %s %s: %w", name, format, err)
			}
			out = append(out, path)
		}
	}
	return out, nil
}

// loadConfig reads packaging/<name>.yaml, with ${BINDIR} expanded and every
// relative source path made relative to root.
func loadConfig(root, name, binDir string) (nfpm.Config, error) {
	path := filepath.Join(root, "packaging", name+".yaml")
	env := func(k string) string {
		if k == "BINDIR" {
			return binDir
		}
		return ""
	}
	cfg, err := nfpm.ParseFileWithEnvMapping(path, env)
	if err != nil {
		return cfg, fmt.Errorf("read %s: %w", path, err)
	}
	if cfg.Name != name {
		return cfg, fmt.Errorf("read %s: it names package %q", path, cfg.Name)
	}
	rooted := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(root, p)
	}
	fix := func(cs files.Contents) {
		for _, c := range cs {
			if c.Type != files.TypeDir && c.Type != files.TypeSymlink {
				c.Source = rooted(c.Source)
			}
		}
	}
	fix(cfg.Contents)
	for _, ov := range cfg.Overrides {
		if ov != nil {
			fix(ov.Contents)
		}
	}
	s := &cfg.Scripts
	s.PreInstall, s.PostInstall = rooted(s.PreInstall), rooted(s.PostInstall)
	s.PreRemove, s.PostRemove = rooted(s.PreRemove), rooted(s.PostRemove)
	return cfg, nil
}

// buildOne writes one package and returns its path.
func buildOne(cfg nfpm.Config, format string, o Options) (string, error) {
	info, err := cfg.Get(format)
	if err != nil {
		return "", err
	}
	info.Version = o.Version.Base
	info.Prerelease = o.Version.Prerelease
	info.VersionMetadata = o.Version.Metadata
	info.Release = o.Release
	info.Arch = o.Arch
	info = nfpm.WithDefaults(info)
	if err := nfpm.PrepareForPackager(info, format); err != nil {
		return "", err
	}
	pkgr, err := nfpm.Get(format)
	if err != nil {
		return "", err
	}
	info.Target = filepath.Join(o.OutDir, pkgr.ConventionalFileName(info))
	f, err := os.CreateTemp(o.OutDir, ".tmp-"+info.Name+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if err := pkgr.Package(info, f); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return "", err
	}
	if err := os.Rename(f.Name(), info.Target); err != nil {
		return "", err
	}
	return info.Target, nil
}
