package packaging

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Version is a package version in the parts deb and rpm both order right:
// deb writes Base[~Prerelease][+Metadata]-Release, rpm Version
// Base[~Prerelease][+Metadata] and Release apart.
type Version struct {
	Base       string // X.Y.Z
	Prerelease string // from a tag vX.Y.Z-rc1: sorts before X.Y.Z ("~"), or empty
	Metadata   string // gitN.gHASH[.dirty] past a tag, or empty on the tag itself
}

// String is the version as dpkg and rpm show it, without the release.
func (v Version) String() string {
	s := v.Base
	if v.Prerelease != "" {
		s += "~" + v.Prerelease
	}
	if v.Metadata != "" {
		s += "+" + v.Metadata
	}
	return s
}

var (
	describeTag = regexp.MustCompile(`^v?([0-9]+\.[0-9]+\.[0-9]+)(?:-([0-9A-Za-z.]+))?-([0-9]+)-g([0-9a-f]{4,40})(-dirty)?$`)
	describeRaw = regexp.MustCompile(`^([0-9a-f]{4,40})(-dirty)?$`)
	// What both dpkg and rpm accept in a version part, and nothing else.
	versionChars = regexp.MustCompile(`^[0-9][0-9A-Za-z.+~]*$`)
	baseChars    = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)
	partChars    = regexp.MustCompile(`^[0-9A-Za-z.]+$`)
)

// ErrVersion reports a git describe output this package does not turn into a
// package version.
var ErrVersion = errors.New("not a version")

// ParseDescribe turns the output of `git describe --tags --long --always
// --dirty` into a package version. A tag vX.Y.Z (or vX.Y.Z-PRE) names the
// base; commits counts the commits since it, or, with no tag (describe gives a
// bare hash), every commit of the history (`git rev-list --count HEAD`), which
// then orders builds on one branch over base 0.0.0. Later commits always sort
// higher, on deb and on rpm.
func ParseDescribe(describe string, commits int) (Version, error) {
	describe = strings.TrimSpace(describe)
	if m := describeTag.FindStringSubmatch(describe); m != nil {
		n, err := strconv.Atoi(m[3])
		if err != nil {
			return Version{}, fmt.Errorf("%q: %w", describe, ErrVersion)
		}
		v := Version{Base: m[1], Prerelease: strings.ReplaceAll(m[2], "-", ".")}
		if n > 0 || m[5] != "" {
			v.Metadata = fmt.Sprintf("git%d.g%s", n, m[4])
			if m[5] != "" {
				v.Metadata += ".dirty"
			}
		}
		return v, v.Validate()
	}
	if m := describeRaw.FindStringSubmatch(describe); m != nil {
		if commits < 1 {
			return Version{}, fmt.Errorf("%q without a tag needs the commit count, got %d: %w", describe, commits, ErrVersion)
		}
		v := Version{Base: "0.0.0", Metadata: fmt.Sprintf("git%d.g%s", commits, m[1])}
		if m[2] != "" {
			v.Metadata += ".dirty"
		}
		return v, v.Validate()
	}
	return Version{}, fmt.Errorf("git describe %q: %w", describe, ErrVersion)
}

// ParseVersion reads a version given by hand (X.Y.Z[~PRE][+META]).
func ParseVersion(s string) (Version, error) {
	rest, meta, _ := strings.Cut(s, "+")
	base, pre, _ := strings.Cut(rest, "~")
	v := Version{Base: base, Prerelease: pre, Metadata: meta}
	return v, v.Validate()
}

// Validate refuses a version that dpkg or rpm would refuse or misorder.
func (v Version) Validate() error {
	if !baseChars.MatchString(v.Base) {
		return fmt.Errorf("base %q is not dotted numbers: %w", v.Base, ErrVersion)
	}
	for _, p := range []string{v.Prerelease, v.Metadata} {
		if p != "" && !partChars.MatchString(p) {
			return fmt.Errorf("%q has characters deb or rpm refuse: %w", p, ErrVersion)
		}
	}
	if !versionChars.MatchString(v.String()) {
		return fmt.Errorf("%q: %w", v.String(), ErrVersion)
	}
	return nil
}
