package cgroup

import (
	"testing"
)

func TestParseSelf(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want selfPaths
	}{
		{
			name: "hybrid host",
			in:   "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n8:pids:/x\n0::/\n",
			want: selfPaths{"name=systemd": "/", "memory": "/process_api/abc", "cpu": "/", "cpuacct": "/", "pids": "/x", "": "/"},
		},
		{
			name: "v2 under systemd",
			in:   "0::/system.slice/cellvisor.service\n",
			want: selfPaths{"": "/system.slice/cellvisor.service"},
		},
		{
			name: "restarted agent already in its leaf",
			in:   "0::/system.slice/cellvisor.service/agent\n",
			want: selfPaths{"": "/system.slice/cellvisor.service"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSelf([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%q: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
	if _, err := parseSelf([]byte("garbage\n")); err == nil {
		t.Error("malformed /proc/self/cgroup: want an error")
	}
}

func TestCPULimits(t *testing.T) {
	for _, tc := range []struct {
		cpus   float64
		quota  int64
		period uint64
	}{{0.5, 50000, 100000}, {0.25, 25000, 100000}, {2, 200000, 100000}} {
		q, p := CPULimits(tc.cpus)
		if q != tc.quota || p != tc.period {
			t.Errorf("CPULimits(%g) = %d/%d, want %d/%d", tc.cpus, q, p, tc.quota, tc.period)
		}
	}
}

func TestNewOnNonCgroupRootIsUnenforced(t *testing.T) {
	m, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if m.Mode() != ModeUnenforced || m.Reason() == nil {
		t.Fatalf("mode %s reason %v: want unenforced with a reason", m.Mode(), m.Reason())
	}
}

func TestStripSubtree(t *testing.T) {
	self, err := parseSelf([]byte("4:memory:/session/cellvisor-demo/agent\n8:pids:/session\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := stripSubtree(self, "cellvisor-demo")
	if got["memory"] != "/session" || got["pids"] != "/session" {
		t.Errorf("got %v: want the agent's own cgroup without the subtree", got)
	}
	if same := stripSubtree(self, ""); same["memory"] != "/session/cellvisor-demo" {
		t.Errorf("no subtree: got %v", same)
	}
}

func TestIsCellName(t *testing.T) {
	for name, want := range map[string]bool{
		"cell-01": true, "cell-00": true, "cell-99": true,
		"cell-1": false, "cell-001": false, "cell-0a": false, "Cell-01": false, "cell_01": false,
		"agent": false, "": false, "cell-01 ": false, "xcell-01": false, "cell-٠١": false,
	} {
		if got := IsCellName(name); got != want {
			t.Errorf("IsCellName(%q) = %v, want %v", name, got, want)
		}
	}
}
