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

// PoolClass is the service class of a pool name: shared, reserved, dedicated
// or quarantine, from the name's prefix.
func PoolClass(pool string) (string, bool) {
	for _, c := range Classes {
		if pool == c || strings.HasPrefix(pool, c+"-") {
			return c, true
		}
	}
	return "", false
}
