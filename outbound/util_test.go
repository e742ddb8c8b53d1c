package outbound

import (
	"testing"

	"cellvisor/egress"
)

func classOf(t testing.TB, s string) egress.Class {
	t.Helper()
	c, err := egress.ParseClass(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
