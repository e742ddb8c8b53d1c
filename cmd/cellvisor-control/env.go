package main

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// envPrefix names the environment variables serve reads its flags from: a
// flag --admin-listen is CELLVISOR_CONTROL_ADMIN_LISTEN. The unit reads them
// from an EnvironmentFile (/etc/cellvisor/control.env).
const envPrefix = "CELLVISOR_CONTROL_"

// envName is the environment variable of flag name; the repeatable
// --hostname takes a list, CELLVISOR_CONTROL_HOSTNAMES.
func envName(flag string) string {
	if flag == "hostname" {
		return envPrefix + "HOSTNAMES"
	}
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// environment variable, when that is set and not empty: flags win over the
// environment. A repeatable flag (--hostname) takes a list separated by
// commas or white space. A bad value is refused naming the variable.
func applyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if v = strings.TrimSpace(v); !ok || v == "" {
			return
		}
		vals := []string{v}
		if _, list := f.Value.(*listFlag); list {
			vals = strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })
		}
		for _, x := range vals {
			if serr := fs.Set(f.Name, x); serr != nil {
				err = fmt.Errorf("environment %s=%q: %w", name, v, serr)
				return
			}
		}
	})
	return err
}
