package main

import (
	"strings"
	"testing"
)

// serve's flags come from CELLVISOR_CONTROL_* where not given; given flags
// win; lists split on commas and spaces; a bad value names its variable.
func TestServeFlagsFromEnvironment(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     map[string]string
		want    map[string]string // flag -> value after applyEnv
		wantErr string
	}{
		{
			name: "environment fills what the command line leaves",
			env: map[string]string{
				"CELLVISOR_CONTROL_HOSTNAMES":    "control.example.test, 192.0.2.7\tcontrol-2.example.test",
				"CELLVISOR_CONTROL_LISTEN":       "0.0.0.0:8443",
				"CELLVISOR_CONTROL_ADMIN_LISTEN": "127.0.0.1:9442",
				"CELLVISOR_CONTROL_DB":           "postgres://control@db.example.test/control",
				"CELLVISOR_CONTROL_ADMIN_TLS":    "true",
			},
			want: map[string]string{
				"hostname":     "control.example.test,192.0.2.7,control-2.example.test",
				"listen":       "0.0.0.0:8443",
				"admin-listen": "127.0.0.1:9442",
				"db":           "postgres://control@db.example.test/control",
				"admin-tls":    "true",
				"data":         defaultData,
			},
		},
		{
			name: "flags win over the environment",
			args: []string{"--listen", "127.0.0.1:7443", "--hostname", "cli.example.test"},
			env:  map[string]string{"CELLVISOR_CONTROL_LISTEN": "0.0.0.0:8443", "CELLVISOR_CONTROL_HOSTNAMES": "env.example.test"},
			want: map[string]string{"listen": "127.0.0.1:7443", "hostname": "cli.example.test"},
		},
		{
			name: "empty variables are unset",
			env:  map[string]string{"CELLVISOR_CONTROL_LISTEN": "  ", "CELLVISOR_CONTROL_HOSTNAMES": ""},
			want: map[string]string{"listen": "127.0.0.1:8443", "hostname": ""},
		},
		{
			name:    "a bad value names its variable",
			env:     map[string]string{"CELLVISOR_CONTROL_ADMIN_TLS": "perhaps"},
			wantErr: `CELLVISOR_CONTROL_ADMIN_TLS="perhaps"`,
		},
		{
			name: "request class limits and the status interval",
			env:  map[string]string{"CELLVISOR_CONTROL_EDGE_ADMISSION": "status=256, ack=2048", "CELLVISOR_CONTROL_STATUS_INTERVAL": "10m"},
			want: map[string]string{"edge-admission": "ack=2048,status=256", "status-interval": "10m0s"},
		},
		{
			name:    "an unknown request class is refused naming it",
			env:     map[string]string{"CELLVISOR_CONTROL_EDGE_ADMISSION": "polls=5"},
			wantErr: `unknown request class "polls"`,
		},
		{
			name:    "a request class limit out of bounds is refused naming them",
			env:     map[string]string{"CELLVISOR_CONTROL_EDGE_ADMISSION": "ack=0x10"},
			wantErr: "want class=N",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := serveCmd()
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			err := applyEnv(cmd.Flags(), func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("applyEnv() = %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for flag, want := range tc.want {
				if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
					t.Errorf("--%s = %q, want %q", flag, got, want)
				}
			}
		})
	}
}
