package packaging

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseDescribe(t *testing.T) {
	tests := []struct {
		name     string
		describe string
		commits  int
		want     string
		wantErr  bool
	}{
		{"on a tag", "v1.2.3-0-gabcdef012345", 0, "1.2.3", false},
		{"past a tag", "v1.2.3-4-gabcdef012345", 0, "1.2.3+git4.gabcdef012345", false},
		{"dirty on a tag", "v1.2.3-0-gabcdef012345-dirty", 0, "1.2.3+git0.gabcdef012345.dirty", false},
		{"tag without v", "1.2.3-1-gabcd", 0, "1.2.3+git1.gabcd", false},
		{"pre-release tag", "v2.0.0-rc1-2-gabcd", 0, "2.0.0~rc1+git2.gabcd", false},
		{"no tag", "abcdef012345", 112, "0.0.0+git112.gabcdef012345", false},
		{"no tag dirty", "abcdef012345-dirty", 112, "0.0.0+git112.gabcdef012345.dirty", false},
		{"no tag no count", "abcdef012345", 0, "", true},
		{"not semver tag", "release-7-gabcd", 0, "", true},
		{"empty", "", 1, "", true},
		{"injection", "v1.2.3-1-gabcd; rm -rf /", 0, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ParseDescribe(tc.describe, tc.commits)
			if tc.wantErr {
				if !errors.Is(err, ErrVersion) {
					t.Fatalf("ParseDescribe(%q) = %q, %v; want ErrVersion", tc.describe, v, err)
				}
				return
			}
			if err != nil || v.String() != tc.want {
				t.Fatalf("ParseDescribe(%q) = %q, %v; want %q", tc.describe, v, err, tc.want)
			}
		})
	}
}

func TestParseVersion(t *testing.T) {
	for _, s := range []string{"1.0.0", "1.0.0~rc1", "1.0.0+git3.gab", "0.0.0~a+b.c"} {
		v, err := ParseVersion(s)
		if err != nil || v.String() != s {
			t.Errorf("ParseVersion(%q) = %q, %v", s, v, err)
		}
	}
	for _, s := range []string{"", "v1.0.0", "1.0.0-1", "1.0.0+a_b", "1.0.0 ", "1..0"} {
		if v, err := ParseVersion(s); err == nil {
			t.Errorf("ParseVersion(%q) = %q, want an error", s, v)
		}
	}
}

// TestVersionOrder asks dpkg and rpm themselves that later builds sort
// higher, as an upgrade needs.
func TestVersionOrder(t *testing.T) {
	ordered := []string{
		"0.0.0+git111.gffff",
		"0.0.0+git112.gaaaa",
		"0.0.0+git112.gaaaa.dirty",
		"1.0.0~rc1",
		"1.0.0~rc1+git1.gabcd",
		"1.0.0",
		"1.0.0+git1.gffff",
		"1.0.0+git2.g0000",
		"1.0.1",
	}
	for _, s := range ordered {
		if _, err := ParseVersion(s); err != nil {
			t.Fatalf("ParseVersion(%q): %v", s, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	checked := 0
	if _, err := exec.LookPath("dpkg"); err == nil {
		checked++
		for i := 1; i < len(ordered); i++ {
			if err := exec.CommandContext(ctx, "dpkg", "--compare-versions", ordered[i-1]+"-1", "lt", ordered[i]+"-1").Run(); err != nil {
				t.Errorf("dpkg: %s is not lower than %s: %v", ordered[i-1], ordered[i], err)
			}
		}
	}
	if _, err := exec.LookPath("rpm"); err == nil {
		checked++
		for i := 1; i < len(ordered); i++ {
			expr := "%{lua:print(rpm.vercmp('" + ordered[i-1] + "', '" + ordered[i] + "'))}"
			out, err := exec.CommandContext(ctx, "rpm", "--eval", expr).Output()
			if err != nil || strings.TrimSpace(string(out)) != "-1" {
				t.Errorf("rpm: vercmp(%s, %s) = %q, %v; want -1", ordered[i-1], ordered[i], out, err)
			}
		}
	}
	if checked == 0 {
		t.Skip("neither dpkg nor rpm is installed (make deps installs both on Debian)")
	}
}
