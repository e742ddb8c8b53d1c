// Command probe links cgexec, as the agent does, for the helper's tests:
// run under any other argv[0], it prints whether it carries the helper and
// the arguments it got, as JSON.
package main

import (
	"encoding/json"
	"os"

	"cellvisor/cgexec"
)

func main() {
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"builtin": cgexec.Builtin(), "args": os.Args})
}
