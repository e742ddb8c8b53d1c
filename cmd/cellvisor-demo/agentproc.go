package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"cellvisor/supervisor"
)

// agentStopWait bounds the agent's graceful stop (every cell drained and
// stopped, stop_timeout 5s each, in parallel) before it is killed.
const agentStopWait = 60 * time.Second

// agentProc is the agent, `cellvisor run`, as the demo's child process.
type agentProc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once reaped; err is set then
	err    error
}

// startAgent starts `bin run --config cfg` with its logs on logs, a file:
// a pipe would make the agent's writes fail (SIGPIPE) once the demo is gone.
//
// Pdeathsig makes the kernel send the agent SIGTERM when the demo dies, even
// by SIGKILL, so that it stops its cells instead of running on unmanaged.
// (The signal follows the thread that forked it; Go never ends a thread
// that is not locked to a goroutine, and this one is not.)
//
// The agent stays in the demo's process group: Ctrl-C in the terminal
// reaches both, and the agent starts its graceful stop at once while the
// demo sends SIGTERM too (harmless twice) and waits for it, bounded. A group
// of its own would only delay that by the demo's relay, and Ctrl-Z would
// then suspend the demo but not the agent. The cells are in groups of their
// own (the supervisor starts them with Setpgid), so the terminal's signals
// never reach them; the agent stops them.
func startAgent(bin, cfg string, logs *os.File) (*agentProc, error) {
	cmd := exec.Command(bin, "run", "--config", cfg)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the agent %s: %w", bin, err)
	}
	a := &agentProc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		a.err = cmd.Wait()
		close(a.exited)
	}()
	return a, nil
}

func (a *agentProc) pid() int { return a.cmd.Process.Pid }

// stop sends SIGTERM, waits up to bound, then SIGKILLs; it returns once the
// agent is reaped, with its exit error (nil for exit status 0).
func (a *agentProc) stop(bound time.Duration) error {
	select {
	case <-a.exited:
		return a.err
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-a.exited:
		return a.err
	case <-t.C:
	}
	_ = a.cmd.Process.Kill()
	<-a.exited
	return fmt.Errorf("the agent did not stop within %s of SIGTERM and was killed: %w", bound, a.err)
}

// agentCLI runs the agent's operator CLI, as a user would.
type agentCLI struct {
	bin string
	cfg string
}

// cliTimeout bounds one CLI call; a restart waits for the drain and the new
// cell's readiness.
const cliTimeout = 2 * time.Minute

// run runs `bin ARGS --config cfg` and returns its stdout; an error carries
// its stderr.
func (c agentCLI) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(args, "--config", c.cfg)...)
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &cliError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

// cliError is a failed CLI call with what it said.
type cliError struct {
	args   []string
	err    error
	stderr string
}

func (e *cliError) Error() string {
	return fmt.Sprintf("cellvisor %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

func (e *cliError) Unwrap() error { return e.err }

// status is `cellvisor status -o json`.
func (c agentCLI) status(ctx context.Context) (supervisor.Status, error) {
	var st supervisor.Status
	out, err := c.run(ctx, "status", "-o", "json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("cellvisor status -o json: %w", err)
	}
	return st, nil
}

// control is `cellvisor VERB CELL -o json`.
func (c agentCLI) control(ctx context.Context, verb, cell string) (supervisor.SlotStatus, error) {
	var st supervisor.SlotStatus
	out, err := c.run(ctx, verb, cell, "-o", "json")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("cellvisor %s %s -o json: %w", verb, cell, err)
	}
	return st, nil
}

// slot finds a slot in st by name.
func slot(st supervisor.Status, name string) (supervisor.SlotStatus, error) {
	for _, s := range st.Slots {
		if s.Name == name {
			return s, nil
		}
	}
	return supervisor.SlotStatus{}, errors.New("status lists no " + name)
}
