package domain

import "strings"

// The pools every edge starts with: cell-01 serves shared-default, cell-02
// quarantine-default.
const (
	PoolSharedDefault     = "shared-default"
	PoolQuarantineDefault = "quarantine-default"
)

// Pool classes, the stable service classes a pool name starts with.
const (
	ClassShared     = "shared"
	ClassReserved   = "reserved"
	ClassDedicated  = "dedicated"
	ClassQuarantine = "quarantine"
)

// Classes lists the pool classes.
var Classes = []string{ClassShared, ClassReserved, ClassDedicated, ClassQuarantine}

// MaxPoolName is the longest pool name.
const MaxPoolName = 64

// PoolClass is the service class of a pool name: shared, reserved, dedicated
// or quarantine, from the name's prefix. A name that is not a valid pool
// name (ValidPoolName) has none. The edge renders pool names into its cells'
// configuration and joins them into file names, so it holds every name it is
// given, signed or not, to the rule the control plane creates them by.
func PoolClass(pool string) (string, bool) {
	if !ValidPoolName(pool) {
		return "", false
	}
	for _, c := range Classes {
		if pool == c || strings.HasPrefix(pool, c+"-") {
			return c, true
		}
	}
	return "", false
}

// ValidPoolName reports 1–64 lowercase letters, digits and inner hyphens or
// dots: the control plane's rule for pool names. Nothing in such a name is
// special to Lua, nginx, a shell or a path (no slash, no leading dot).
func ValidPoolName(s string) bool { return ValidName(s, MaxPoolName) }

// ValidName reports 1–max lowercase letters, digits and inner hyphens or
// dots: the control plane's names (pools, orgs, edges), which read well in
// a table and a log line.
func ValidName(s string, max int) bool {
	if s == "" || len(s) > max || s[0] == '-' || s[0] == '.' || s[len(s)-1] == '-' || s[len(s)-1] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}
