package manifest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCheckRuntimes(t *testing.T) {
	many := make([]CellRuntime, MaxAckRuntimes+1)
	for i := range many {
		many[i] = CellRuntime{Cell: fmt.Sprintf("cell-%02d", i+1), Version: "nginx/1.22.1"}
	}
	for _, tc := range []struct {
		name string
		rs   []CellRuntime
		want string // "" for accepted
	}{
		{"none", nil, ""},
		{"nginx and openresty", []CellRuntime{{Cell: "cell-01", Version: "nginx/1.22.1", Superseded: true}, {Cell: "cell-02", Version: "openresty/1.25.3.1"}}, ""},
		{"unknown version", []CellRuntime{{Cell: "cell-01"}}, ""},
		{"a full edge", many[:MaxAckRuntimes], ""},
		{"more cells than an edge has", many, "at most 32"},
		{"a cell twice", []CellRuntime{{Cell: "cell-01"}, {Cell: "cell-01"}}, `cell "cell-01" twice`},
		{"a control character", []CellRuntime{{Cell: "cell-01", Version: "nginx/1.22.1\n"}}, "want at most 64 characters"},
		{"markup", []CellRuntime{{Cell: "cell-01", Version: "<b>nginx</b>"}}, "want at most 64 characters"},
		{"too long", []CellRuntime{{Cell: "cell-01", Version: strings.Repeat("v", MaxRuntimeVersion+1)}}, "want at most 64 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRuntimes(tc.rs)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}
