package config

// Topology is where the edge stands, as its gateway rows report it to the
// control API (front doors): all optional, each 0-64 characters of a-z,
// A-Z, 0-9, '-', '_' and '.'.
type Topology struct {
	// Region is a cloud or geographic region, e.g. eu-central.
	Region string `yaml:"region"`
	// Zone is an availability zone within the region, e.g. eu-central-1a.
	Zone string `yaml:"zone"`
	// Locality is a finer place (a site, a city), e.g. fra.
	Locality string `yaml:"locality"`
}

func (t Topology) validate(bad func(field, format string, args ...any)) {
	for _, f := range []struct{ name, v string }{{"topology.region", t.Region}, {"topology.zone", t.Zone}, {"topology.locality", t.Locality}} {
		if !topologyName(f.v) {
			bad(f.name, "must be at most 64 characters of a-z, A-Z, 0-9, -, _ and ., got %q", f.v)
		}
	}
}

func topologyName(s string) bool {
	if len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
