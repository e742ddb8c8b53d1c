package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cellvisor/config"
)

// cellvisor runs a command line in-process and returns stdout, stderr and
// the error main would print.
func cellvisor(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// --help, -h and help [COMMAND] print the usage on stdout and succeed.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "cellvisor run --config"},
		{[]string{"-h"}, "Available Commands:"},
		{[]string{"help"}, "Available Commands:"},
		{[]string{"help", "drain"}, "stop advertising readiness"},
		{[]string{"drain", "--help"}, "cellvisor drain CELL"},
		{[]string{"restart", "-h"}, "rate-limited per cell"},
		{[]string{"help", "enroll"}, "--token string"},
		{[]string{"status", "--help", "--config", "/nonexistent"}, "-o, --output string"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			stdout, stderr, err := cellvisor(t, tc.args...)
			if err != nil || stderr != "" || !strings.Contains(stdout, "Usage:") || !strings.Contains(stdout, tc.want) {
				t.Errorf("cellvisor %q: error %v, stderr %q, stdout:\n%s\nwant the usage with %q on stdout", tc.args, err, stderr, stdout, tc.want)
			}
		})
	}
}

// --config is honoured before and after the command: the error names the
// file given, not the default.
func TestConfigFlagBeforeAndAfter(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	for _, args := range [][]string{
		{"--config", missing, "run"},
		{"run", "--config", missing},
		{"--config=" + missing, "status"},
		{"status", "-o", "json", "--config", missing},
		{"drain", "cell-01", "--config", missing},
		{"enroll", "--control", "https://127.0.0.1:1", "--token", "cvt_x", "--config", missing},
	} {
		_, _, err := cellvisor(t, args...)
		if err == nil || !strings.Contains(err.Error(), "no configuration file at "+missing) || !strings.Contains(err.Error(), "--config FILE") {
			t.Errorf("cellvisor %q: %v, want the missing %s named with --config", args, err, missing)
		}
	}
	_, _, err := cellvisor(t, "status")
	if err == nil || !strings.Contains(err.Error(), "no configuration file at "+config.DefaultPath+": pass --config FILE") {
		if _, serr := os.Stat(config.DefaultPath); serr != nil {
			t.Errorf("status with the default path: %v, want the default path named with --config", err)
		}
	}
}

// Errors name the fix: an unknown flag says where it belongs.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"flag of another command", []string{"status", "--token", "x"},
			`unknown flag --token for "cellvisor status": it belongs to "cellvisor enroll"`},
		{"flag of no command", []string{"drain", "cell-01", "--bogus"}, `unknown flag --bogus for "cellvisor drain": see cellvisor drain --help`},
		{"unknown shorthand", []string{"status", "-x"}, `unknown flag -x for "cellvisor status"`},
		{"unknown flag before the command", []string{"--control", "u", "status"}, `it belongs to "cellvisor enroll"`},
		{"no command", nil, "no command given"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate" for "cellvisor"`},
		{"missing cell", []string{"drain"}, "usage: cellvisor drain CELL"},
		{"two cells", []string{"restart", "cell-01", "cell-02"}, "usage: cellvisor restart CELL"},
		{"bad output format", []string{"undrain", "cell-01", "-o", "yaml"}, `unknown output format "yaml" (text or json)`},
		{"status output format", []string{"status", "-o", "yaml"}, `unknown output format "yaml" (table or json)`},
		{"enroll without token", []string{"enroll", "--control", "https://127.0.0.1:1"}, "enroll needs --control URL and --token TOKEN"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CELLVISOR_TOKEN", "")
			_, _, err := cellvisor(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("cellvisor %q: %v, want an error containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// The built binary: help on stdout with exit 0, errors on stderr with exit 1.
func TestBinaryHelpAndErrors(t *testing.T) {
	bin := buildAgent(t)
	for _, args := range [][]string{{"--help"}, {"help", "status"}, {"run", "-h"}} {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil || stderr.Len() != 0 || !strings.Contains(stdout.String(), "Usage:") {
			t.Errorf("cellvisor %q: %v, stderr %q, stdout:\n%s", args, err, stderr.String(), stdout.String())
		}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "status", "--bogus")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || stdout.Len() != 0 ||
		stderr.String() != "cellvisor: unknown flag --bogus for \"cellvisor status\": see cellvisor status --help for its flags\n" {
		t.Errorf("cellvisor status --bogus: %v, stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
}
