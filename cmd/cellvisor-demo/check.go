package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"cellvisor/supervisor"
)

// checkWait bounds one step of the check scenario.
const checkWait = 60 * time.Second

// check runs what docs/demo.md shows, through the agent's CLI and the control
// API's admin API, and fails at the first step that does not do what it
// says: drain, undrain, a publish of revision 2 reaching the cell, an
// operator restart, and the restart rate limit's refusal.
func (e *env) check(ctx context.Context) error {
	readyURL := fmt.Sprintf("http://127.0.0.1:%d/.cellvisor/ready", e.o.httpBase)
	const rev2 = "revision 2\n"
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"drain cell-01: readiness answers 503, status shows drained, requests are still served", func(ctx context.Context) error {
			st, err := e.cli.control(ctx, "drain", "cell-01")
			if err != nil {
				return err
			}
			if st.State != supervisor.StateDrained || !st.Drained {
				return fmt.Errorf("drain -o json: state %s, drained %t", st.State, st.Drained)
			}
			if err := e.wantReadiness(ctx, readyURL, http.StatusServiceUnavailable); err != nil {
				return err
			}
			if err := e.wantSlotState(ctx, supervisor.StateDrained); err != nil {
				return err
			}
			_, err = get(ctx, e.cellURL, demoHost)
			return err
		}},
		{"undrain cell-01: readiness answers 200, status shows ready", func(ctx context.Context) error {
			st, err := e.cli.control(ctx, "undrain", "cell-01")
			if err != nil {
				return err
			}
			if st.State != supervisor.StateReady || st.Drained {
				return fmt.Errorf("undrain -o json: state %s, drained %t", st.State, st.Drained)
			}
			if err := e.wantReadiness(ctx, readyURL, http.StatusOK); err != nil {
				return err
			}
			return e.wantSlotState(ctx, supervisor.StateReady)
		}},
		{"publish revision 2: cell-01 serves it after the next poll", func(ctx context.Context) error {
			rev, err := e.publish(ctx, rev2)
			if err != nil {
				return err
			}
			if rev != 2 {
				return fmt.Errorf("published revision %d, want 2", rev)
			}
			return e.awaitServing(ctx, rev2)
		}},
		{"restart cell-01: a new master serves again", func(ctx context.Context) error {
			_, err := e.restart(ctx)
			return err
		}},
		{"restart cell-01 twice more, then a 4th is refused by the rate limit", func(ctx context.Context) error {
			var last supervisor.SlotStatus
			for range 2 {
				var err error
				if last, err = e.restart(ctx); err != nil {
					return err
				}
			}
			_, err := e.cli.control(ctx, "restart", "cell-01")
			var ce *cliError
			if !errors.As(err, &ce) || !strings.Contains(ce.stderr, "restart refused by the rate limit") {
				return fmt.Errorf("4th restart: %v, want the rate limit's refusal", err)
			}
			fmt.Fprintf(e.o.out, "  refused as it should be: %s\n", ce.stderr)
			st, err := e.cli.status(ctx)
			if err != nil {
				return err
			}
			s, err := slot(st, "cell-01")
			if err != nil {
				return err
			}
			if s.PID != last.PID || s.State != supervisor.StateReady {
				return fmt.Errorf("after the refused restart cell-01 is %s with pid %d, want ready with pid %d", s.State, s.PID, last.PID)
			}
			return nil
		}},
	}
	for i, s := range steps {
		fmt.Fprintf(e.o.out, "check %d/%d: %s\n", i+1, len(steps), s.name)
		sctx, cancel := context.WithTimeout(ctx, checkWait)
		err := s.run(sctx)
		cancel()
		if err != nil {
			e.showStatus(ctx)
			return fmt.Errorf("check %q: %w", s.name, err)
		}
	}
	return nil
}

// restart restarts cell-01 through the CLI and checks a new master is ready
// and serves the latest revision.
func (e *env) restart(ctx context.Context) (supervisor.SlotStatus, error) {
	st, err := e.cli.status(ctx)
	if err != nil {
		return supervisor.SlotStatus{}, err
	}
	before, err := slot(st, "cell-01")
	if err != nil {
		return before, err
	}
	after, err := e.cli.control(ctx, "restart", "cell-01")
	if err != nil {
		return after, err
	}
	if after.State != supervisor.StateReady || after.PID == 0 || after.PID == before.PID {
		return after, fmt.Errorf("restart -o json: state %s, pid %d (was %d), want ready with a new pid", after.State, after.PID, before.PID)
	}
	fmt.Fprintf(e.o.out, "  cell-01: master pid %d -> %d\n", before.PID, after.PID)
	if _, err := get(ctx, e.cellURL, demoHost); err != nil {
		return after, fmt.Errorf("after the restart: %w", err)
	}
	return after, nil
}

// wantReadiness waits until the cell's readiness check answers code.
func (e *env) wantReadiness(ctx context.Context, url string, code int) error {
	return poll(ctx, func() error {
		got, body, err := fetch(ctx, url, "")
		if err == nil && got != code {
			err = fmt.Errorf("GET %s: HTTP %d %q, want %d", url, got, strings.TrimSpace(body), code)
		}
		return err
	})
}

// wantSlotState checks `cellvisor status -o json` shows cell-01 in state.
func (e *env) wantSlotState(ctx context.Context, state supervisor.State) error {
	st, err := e.cli.status(ctx)
	if err != nil {
		return err
	}
	s, err := slot(st, "cell-01")
	if err != nil {
		return err
	}
	if s.State != state || s.Drained != (state == supervisor.StateDrained) {
		return fmt.Errorf("status -o json: cell-01 is %s (drained %t), want %s", s.State, s.Drained, state)
	}
	return nil
}

// showStatus prints what the agent says of itself after a failed check:
// the cells' states, sequences and reasons say where to look next.
func (e *env) showStatus(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := e.cli.run(ctx, "status")
	fmt.Fprintf(e.o.out, "\nthe agent's status after the failed check:\n%s", out)
	if err != nil {
		fmt.Fprintf(e.o.out, "(%v)\n", err)
	}
}
