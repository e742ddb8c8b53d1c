package controlapi

import (
	"fmt"

	"cellvisor/manifest"
)

// validRuntimes checks an ack's runtimes (manifest.CheckRuntimes), each
// of a cell an edge may have (cell-01 … cell-32).
func validRuntimes(rs []manifest.CellRuntime) error {
	if err := manifest.CheckRuntimes(rs); err != nil {
		return err
	}
	for _, r := range rs {
		if !validCell(r.Cell, manifest.MaxAckRuntimes) {
			return fmt.Errorf("%w: runtimes: cell %q: want cell-01 to cell-%02d", manifest.ErrInvalid, r.Cell, manifest.MaxAckRuntimes)
		}
	}
	return nil
}
