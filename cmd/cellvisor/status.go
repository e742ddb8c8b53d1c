package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"cellvisor/adminsock"
	"cellvisor/agent"
	"cellvisor/config"
	"cellvisor/edgeapi"
	"cellvisor/internal/cli"
	"cellvisor/supervisor"
)

func statusCmd(load func() (config.Agent, error), stdout io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "status",
		Short: "show the running agent's slots",
		Long: `Ask the running agent, through its admin socket, for its status: its cgroups and limits, its
control-plane contact, and each slot's pool, state, pid, ports, resource use and restarts.`,
		Args: cobra.NoArgs,
	}
	format := cli.Output(c, "table", "json")
	c.RunE = func(c *cobra.Command, _ []string) error {
		f, err := format()
		if err != nil {
			return err
		}
		cfg, err := load()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(c.Context(), 5*time.Second)
		defer cancel()
		st, err := adminsock.NewClient(agent.AdminSocket(cfg)).Status(ctx)
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		if f == "json" {
			return printJSON(stdout, st)
		}
		printStatus(stdout, st)
		return nil
	}
	return c
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printStatus(w io.Writer, st supervisor.Status) {
	enforced := "limits enforced"
	if !st.Enforced {
		enforced = "limits NOT enforced"
	}
	fmt.Fprintf(w, "agent pid %d, %s, up %s, cgroups %s %s, %s\n", st.PID, st.Version,
		time.Since(st.StartedAt).Round(time.Second), st.CgroupMode, st.CgroupPath, enforced)
	if st.AgentLimits != "" {
		fmt.Fprintf(w, "agent limits: %s\n", st.AgentLimits)
	}
	if st.Refusal != "" {
		fmt.Fprintf(w, "refusal: %s\n", st.Refusal)
	}
	switch {
	case st.CellUsers == "slot":
		fmt.Fprintln(w, "cells run as their slots' own users")
	case st.CellUsers == "agent":
		fmt.Fprintln(w, "cells run as the agent's user (cell_users: agent)")
	case st.CellUsers != "":
		fmt.Fprintf(w, "cells run as the agent's user: %s\n", cli.Printable(strings.TrimPrefix(st.CellUsers, "agent: ")))
	}
	if c := st.Control; c != nil {
		ago := func(t *time.Time) string {
			if t == nil {
				return "never"
			}
			return time.Since(*t).Round(time.Second).String() + " ago"
		}
		switch c.Enrollment {
		case agent.EnrollmentEnrolled:
			fmt.Fprintf(w, "control: enrolled as %s with %s, last successful contact %s\n", c.EdgeID, c.ControlURL, ago(c.LastSuccess))
			if c.CertExpires != nil && c.NextRenewal != nil {
				fmt.Fprintf(w, "certificate: expires %s, next renewal %s", c.CertExpires.Local().Format(time.RFC3339), c.NextRenewal.Local().Format(time.RFC3339))
				if c.RenewalError != "" {
					fmt.Fprintf(w, " (last attempt failed: %s)", c.RenewalError)
				}
				fmt.Fprintln(w)
			}
		case agent.EnrollmentSpool:
			fmt.Fprintln(w, "control: fed from a spool directory")
		case agent.EnrollmentUnusable:
			fmt.Fprintf(w, "control: enrolled, but the identity is unusable (%s): serving the releases on disk; enroll again with --replace\n", c.Error)
		default:
			fmt.Fprintln(w, "control: not enrolled (cellvisor enroll --control URL --token TOKEN)")
		}
		if c.Enrollment == agent.EnrollmentEnrolled || c.Enrollment == agent.EnrollmentSpool {
			fmt.Fprintf(w, "manifests: active sequence %d, last poll %s, %d ack(s) pending", c.ActiveSequence, ago(c.LastPoll), c.PendingAcks)
			if c.LastPollError != "" {
				fmt.Fprintf(w, ", last error: %s", c.LastPollError)
			}
			fmt.Fprintln(w)
		}
	}
	printEgress(w, st.Egress)
	printRuntime(w, st.Runtime)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CELL\tPOOL\tSTATE\tPID\tHTTP\tHTTPS\tMEMORY\tPIDS\tTHROTTLED\tCONNS\tDISK\tRESTARTS\tREASON")
	for _, s := range st.Slots {
		pool, pid, mem, pids, thr, conns, disk := "-", "-", "-", "-", "-", "-", "-"
		if s.Pool != "" {
			pool = s.Pool
		}
		if s.PID != 0 {
			pid = fmt.Sprint(s.PID)
		}
		if u := s.Usage; u != nil {
			mem = fmt.Sprintf("%s/%s", mib(u.MemoryBytes), mib(u.MemoryLimit))
			pids = fmt.Sprintf("%d/%d", u.PIDs, u.PIDsLimit)
			thr = fmt.Sprintf("%d (%s)", u.CPUThrottled, time.Duration(u.CPUThrottleNS).Round(time.Millisecond))
		}
		if c := s.Cell; c != nil {
			conns = fmt.Sprintf("%d", c.Connections.Active)
			if c.Security.AuthFailures > 0 {
				s.Reason = strings.TrimSpace(fmt.Sprintf("%s %d refused private calls", s.Reason, c.Security.AuthFailures))
			}
			expiry := make(map[string]int64, len(c.TLS.Certificates))
			for d, cert := range c.TLS.Certificates {
				expiry[d] = cert.NotAfter
			}
			if note := expiringNote(expiry, time.Now()); note != "" {
				s.Reason = strings.TrimSpace(s.Reason + " " + note)
			}
		}
		if d := s.Disk; d != nil {
			disk = fmt.Sprintf("c%s r%s l%s", share(d.Cache), share(d.RequestTmp), share(d.Logs))
		}
		if r := s.Runtime; r != nil && r.Superseded {
			s.Reason = strings.TrimSpace(s.Reason + " " + supersededNote(r))
		}
		// Crash restarts, then operator restarts: "2+1".
		restarts := fmt.Sprintf("%d+%d", s.Restarts, s.OperatorRestarts)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, pool, s.State, pid,
			s.HTTPPort, s.HTTPSPort, mem, pids, thr, conns, disk, restarts, s.Reason)
	}
	tw.Flush()
}

// printRuntime shows the cells' binary and how many cells run a replaced
// one.
func printRuntime(w io.Writer, r *supervisor.RuntimeStatus) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "runtime: %s %s", cli.Printable(r.Binary), cli.Printable(orUnknown(r.Version)))
	if r.Superseded > 0 {
		fmt.Fprintf(w, ", %d cell(s) run a superseded binary", r.Superseded)
	}
	if r.Upgrade != "" {
		fmt.Fprintf(w, ", upgrade %s", r.Upgrade)
	}
	if r.Reason != "" {
		fmt.Fprintf(w, ": %s", cli.Printable(r.Reason))
	}
	fmt.Fprintln(w)
}

// supersededNote is a cell's REASON note: the version it runs, the one the
// binary's path holds now.
func supersededNote(r *supervisor.CellRuntime) string {
	return fmt.Sprintf("runs superseded %s (binary now %s)", cli.Printable(orUnknown(r.Version)), cli.Printable(orUnknown(r.Current)))
}

func orUnknown(v string) string {
	if v == "" {
		return "unknown version"
	}
	return v
}

// printEgress shows the send path: the route per class (direct, proxy,
// refused), its holder, epoch and lease expiry, the journal's depth and the
// last error.
func printEgress(w io.Writer, e *edgeapi.EgressStatus) {
	if e == nil {
		return
	}
	if e.Routes == nil {
		fmt.Fprintf(w, "egress: off (%s)\n", e.Error)
		return
	}
	intake := "no intake"
	if e.IntakeURL != "" {
		intake = "intake " + e.IntakeURL
	}
	j := e.Journal
	fmt.Fprintf(w, "egress: org %s, %s, journal %d/%d bundles %s/%s, %d refused at the bound\n", e.Org, intake,
		j.Bundles, j.MaxBundles, mib(uint64(j.Bytes)), mib(uint64(j.MaxBytes)), j.Refused)
	if e.Error != "" {
		fmt.Fprintf(w, "egress intake: %s\n", e.Error)
	}
	if j.LastError != "" {
		fmt.Fprintf(w, "egress journal: %s\n", j.LastError)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tROUTE\tHOLDER\tEPOCH\tLEASE EXPIRES\tREACH\tPENDING\tSENT (DIRECT/FORWARDED/FALLBACK)\tREASON / LAST ERROR")
	for _, r := range e.Routes {
		holder, epoch, expires, reach := "-", "-", "-", "-"
		if r.Holder != "" {
			holder = r.Holder
			epoch = fmt.Sprint(r.Epoch)
		}
		if r.Alone {
			holder += " (alone)"
		}
		if r.Expires != nil {
			expires = fmt.Sprintf("in %s", time.Until(*r.Expires).Round(time.Second))
		}
		if rr, ok := e.Reach[r.Class]; ok {
			reach = map[bool]string{true: "yes", false: "no"}[rr.Reachable]
		}
		note := r.Reason
		if r.Route == edgeapi.RouteRefused {
			note = fmt.Sprintf("refused at %s: %s", r.Stage, r.Reason)
		}
		if r.LastError != "" {
			note = strings.TrimPrefix(note+"; last error: "+r.LastError, "; ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d/%d/%d\t%s\n", r.Class, r.Route, holder, epoch, expires, reach,
			r.Pending, r.Direct, r.Forwarded, r.Fallback, note)
	}
	tw.Flush()
}

func mib(b uint64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// controlCmd is drain, undrain or restart (verb) of one cell: it prints the
// cell's state afterwards as a line or, with -o json, as the slot's status.
func controlCmd(verb, short, long string, load func() (config.Agent, error), stdout io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:     verb + " CELL",
		Short:   short,
		Long:    strings.TrimSpace(short + ".\n\n" + long),
		Example: fmt.Sprintf("  cellvisor %s cell-01\n  cellvisor %s cell-01 -o json", verb, verb),
		Args:    cli.ExactArgs(1),
	}
	format := cli.Output(c, "text", "json")
	c.RunE = func(c *cobra.Command, args []string) error {
		f, err := format()
		if err != nil {
			return err
		}
		cfg, err := load()
		if err != nil {
			return err
		}
		// A restart waits for requests in flight and the new cell's readiness.
		ctx, cancel := context.WithTimeout(c.Context(), cfg.Restart.DrainTimeout.D()+cfg.OpenResty.ReadyTimeout.D()+30*time.Second)
		defer cancel()
		st, err := adminsock.NewClient(agent.AdminSocket(cfg)).Control(ctx, verb, args[0])
		if err != nil && !adminsock.AgentAnswered(err) {
			return fmt.Errorf("%s %s: %w", verb, args[0], err)
		}
		if err != nil {
			return err // the agent's answer names the operation
		}
		if f == "json" {
			return printJSON(stdout, st)
		}
		_, err = fmt.Fprintf(stdout, "%s: %s (pid %d)\n", st.Name, st.State, st.PID)
		return err
	}
	return c
}

// share is what a cell holds against a disk budget, in percent of it.
func share(b supervisor.DiskBudget) string {
	if b.Budget <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d%%", b.Bytes*100/b.Budget)
}

// expiringNote names the certificates a cell presents that expire within
// 14 days (the sample alert's threshold), soonest first, from their expiry
// (Unix seconds) by domain; "" when none.
func expiringNote(certs map[string]int64, now time.Time) string {
	type soon struct {
		domain string
		left   time.Duration
	}
	var list []soon
	for d, c := range certs {
		if left := time.Unix(c, 0).Sub(now); left < 14*24*time.Hour {
			list = append(list, soon{d, left})
		}
	}
	if len(list) == 0 {
		return ""
	}
	sort.Slice(list, func(i, j int) bool { return list[i].left < list[j].left })
	parts := make([]string, 0, 3)
	for _, c := range list[:min(3, len(list))] {
		if c.left <= 0 {
			parts = append(parts, c.domain+" expired")
		} else {
			parts = append(parts, fmt.Sprintf("%s in %.0fd", c.domain, math.Ceil(c.left.Hours()/24)))
		}
	}
	if len(list) > 3 {
		parts = append(parts, fmt.Sprintf("and %d more", len(list)-3))
	}
	return "certificate expiring: " + strings.Join(parts, ", ")
}
