package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"cellvisor/controlclient"
	"cellvisor/edgeapi"
	"cellvisor/internal/celluser"
	"cellvisor/internal/procstat"
	"cellvisor/outbound"
)

// egressPath is the agent's governed-egress send path (package outbound):
// set up on an edge enrolled with a control API that named its org.
type egressPath struct {
	sender   *outbound.Sender
	producer *outbound.Producer
	intake   net.Listener     // nil: no intake
	intakeS  *outbound.Intake // serves intake
	off      string           // why there is no send path, for status
}

// setupEgress prepares the send path: the journal under
// <state_dir>/egress, the senders, the producers and the intake's
// listener. A failure to listen leaves the intake off (status says why)
// rather than the agent: the cells must not go down over it.
func (a *Agent) setupEgress() error {
	if a.client == nil {
		return nil
	}
	a.egress = &egressPath{}
	if a.id.Org == "" {
		a.egress.off = "the control API named no org for this edge at enrollment (an older control API): no egress; enroll again to learn it"
		a.log.Warn("governed egress off", zap.String("reason", a.egress.off))
		return nil
	}
	ec := a.cfg.Egress
	dir := filepath.Join(a.cfg.StateDir, "egress")
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Source.PollTimeout.D())
	defer cancel()
	j, err := outbound.OpenJournal(ctx, filepath.Join(dir, "journal"), ec.JournalBundles, int64(ec.JournalBytes), a.log.Named("egress"))
	if err != nil {
		return err
	}
	idDir := a.cfg.IdentityDir()
	ptls, err := outbound.NewPeerTLS(filepath.Join(idDir, controlclient.CertFile), filepath.Join(idDir, controlclient.KeyFile), filepath.Join(idDir, controlclient.CAFile))
	if err != nil {
		return fmt.Errorf("egress identity: %w", err)
	}
	intakeURL := ec.IntakeURL
	if intakeURL == "" && ec.IntakeListen != "" {
		intakeURL = "https://" + ec.IntakeListen
	}
	s, err := outbound.NewSender(outbound.Options{
		EdgeID: a.id.EdgeID, Org: a.id.Org, Control: a.client, Journal: j, TLS: ptls, IntakeURL: intakeURL,
		ProbeTimeout: ec.ProbeTimeout.D(), SendTimeout: ec.SendTimeout.D(), MaxRenew: ec.MaxRenew.D(), Logger: a.log,
		IntakeConns: outbound.IntakeLimits{MaxConns: ec.IntakeMaxConns, MaxConnsPerIP: ec.IntakeMaxConnsPerIP, HandshakeTimeout: ec.IntakeHandshakeTimeout.D()},
	})
	if err != nil {
		return err
	}
	a.egress.sender = s
	if ec.Interval.D() > 0 {
		a.egress.producer = outbound.NewProducer(s, dir, a.cellSamples)
	}
	if ec.IntakeListen != "" {
		ln, err := net.Listen("tcp", ec.IntakeListen)
		if err != nil {
			err = fmt.Errorf("egress intake: %w", err)
			s.SetIntakeError(err)
			a.log.Error("egress intake not listening: peers send direct instead of forwarding here", zap.Error(err))
		} else {
			a.egress.intake, a.egress.intakeS = ln, outbound.NewIntake(s)
		}
	}
	return nil
}

// cellSamples is the cells' counters, for the producers.
func (a *Agent) cellSamples(ctx context.Context) []outbound.CellSample {
	st := a.sup.LiveStatus(ctx)
	var out []outbound.CellSample
	for _, s := range st.Slots {
		if s.Cell == nil {
			continue
		}
		out = append(out, outbound.CellSample{Cell: s.Name, Pool: s.Pool, Requests: s.Cell.Requests,
			AuthFailures: s.Cell.Security.AuthFailures, LastReason: s.Cell.Security.LastReason,
			Incarnation: incarnation(a.users[s.Name], s.PID)})
	}
	return out
}

// incarnation names a running master by its pid and start time (clock
// ticks since boot): an adopted master keeps it, a restarted one (even on
// a recycled pid) does not. "" where the master cannot be read. A master
// of its slot's own user u is read as u: the packaged unit's /proc shows
// the agent its own processes alone.
func incarnation(u *celluser.User, pid int) string {
	if pid <= 0 {
		return ""
	}
	var f []string
	if err := celluser.Do(u, func() (err error) { f, err = procstat.Fields(pid); return err }); err != nil {
		return ""
	}
	return strconv.Itoa(pid) + "@" + f[19]
}

// runEgress runs the senders, the producers and the intake until ctx ends.
func (a *Agent) runEgress(ctx context.Context, wg *sync.WaitGroup) {
	e := a.egress
	if e == nil || e.sender == nil {
		return
	}
	wg.Add(1)
	go func() { defer wg.Done(); e.sender.Run(ctx) }()
	if e.producer != nil {
		wg.Add(1)
		go func() { defer wg.Done(); e.producer.Run(ctx, a.cfg.Egress.Interval.D()) }()
	}
	if e.intake != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.intakeS.Serve(ctx, e.intake); err != nil && !errors.Is(err, net.ErrClosed) {
				a.log.Error("egress intake", zap.Error(err))
				e.sender.SetIntakeError(err)
			}
		}()
	}
}

// egressStatus is the send path's part of the status.
func (a *Agent) egressStatus() *edgeapi.EgressStatus {
	switch {
	case a.egress == nil:
		return nil
	case a.egress.sender == nil:
		return &edgeapi.EgressStatus{Error: a.egress.off}
	}
	return a.egress.sender.Status()
}
