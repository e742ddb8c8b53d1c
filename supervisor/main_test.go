package supervisor_test

import (
	"os"
	"testing"

	"cellvisor/cgroup"
)

func TestMain(m *testing.M) {
	cgroup.ExecInit() // v1 hosts start cells through a re-exec of this binary
	os.Exit(m.Run())
}
