package config

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var errEOF = io.EOF

// Bytes is a size in bytes, written in YAML as "512MiB", "64M", "1GiB" or a
// plain number of bytes.
type Bytes int64

// Size units.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
)

// String prints the largest exact binary unit.
func (b Bytes) String() string {
	switch {
	case b != 0 && b%GiB == 0:
		return fmt.Sprintf("%dGiB", b/GiB)
	case b != 0 && b%MiB == 0:
		return fmt.Sprintf("%dMiB", b/MiB)
	case b != 0 && b%KiB == 0:
		return fmt.Sprintf("%dKiB", b/KiB)
	}
	return strconv.FormatInt(int64(b), 10)
}

// ParseBytes parses a size such as "512MiB" (binary units; K/M/G are binary too).
func ParseBytes(s string) (Bytes, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   Bytes
	}{{"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"G", GiB}, {"M", MiB}, {"K", KiB}, {"B", 1}}
	mult := Bytes(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad size %q: want a whole number with an optional unit (KiB, MiB, GiB)", s)
	}
	if n > int64((1<<62)/mult) {
		return 0, errors.New("size too large")
	}
	return Bytes(n) * mult, nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *Bytes) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseBytes(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (b Bytes) MarshalYAML() (any, error) { return b.String(), nil }

// Duration is a time.Duration written in YAML as "10s", "2m".
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: bad duration %q: %w", n.Line, n.Value, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }
