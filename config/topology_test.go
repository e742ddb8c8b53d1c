package config

import (
	"errors"
	"strings"
	"testing"
)

func TestTopology(t *testing.T) {
	c, err := Parse([]byte("topology:\n  region: eu-central\n  zone: eu-central-1a\n  locality: fra\n"))
	if err != nil || c.Topology != (Topology{Region: "eu-central", Zone: "eu-central-1a", Locality: "fra"}) {
		t.Fatalf("topology %+v, %v", c.Topology, err)
	}
	if c, err := Parse(nil); err != nil || c.Topology != (Topology{}) {
		t.Fatalf("no topology: %+v, %v", c.Topology, err)
	}
	for yaml, field := range map[string]string{
		"topology:\n  region: eu central\n":                    "topology.region",
		"topology:\n  zone: " + strings.Repeat("z", 65) + "\n": "topology.zone",
		"topology:\n  locality: \"fra\\n\"\n":                  "topology.locality",
		"topology:\n  country: de\n":                           "field country not found",
	} {
		_, err := Parse([]byte(yaml))
		if !errors.Is(err, ErrInvalid) && !strings.Contains(err.Error(), field) {
			t.Errorf("%q: %v, want a refusal naming %s", yaml, err, field)
			continue
		}
		if !strings.Contains(err.Error(), field) {
			t.Errorf("%q: %v does not name %s", yaml, err, field)
		}
	}
}
