package agent

import (
	"crypto/ecdh"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"cellvisor/activation"
	"cellvisor/controlclient"
	"cellvisor/runtime"
	"cellvisor/supervisor"
)

// The supervisor tells the acks each cell's runtime (issue 41).
var _ activation.RuntimeTeller = (*supervisor.Supervisor)(nil)

// chooseSource picks where signed manifests come from: a spool directory
// when one is configured, else the control API the edge enrolled with, else
// none (standalone, or not enrolled yet).
func (a *Agent) chooseSource() error {
	a.enrollment = EnrollmentNone
	if a.cfg.Source.Dir != "" {
		id, key, err := LoadIdentity(a.cfg.Identity())
		if err != nil {
			return err
		}
		a.enrollment, a.id, a.key = EnrollmentSpool, &id, key
		a.source = controlclient.DirSource{Dir: a.cfg.Source.Dir}
		return nil
	}
	id, key, err := a.enrolled()
	if errors.Is(err, errUnusable) {
		a.unusable(err)
		return nil
	}
	if err != nil || id == nil {
		return err
	}
	if a.cfg.DomainsDir != "" {
		return fmt.Errorf("domains_dir: this edge is enrolled with %s; its configuration comes from there, remove domains_dir", id.ControlURL)
	}
	a.id, a.key = id, key
	a.client, err = controlclient.New(controlclient.Options{URL: id.ControlURL, Dir: a.cfg.IdentityDir(), Logger: a.log,
		LongPoll: longPoll(a.cfg.Source.PollTimeout.D())})
	if err != nil {
		a.unusable(fmt.Errorf("%w: control client: %v", errUnusable, err))
		return nil
	}
	if a.tasks, err = openLedger(filepath.Join(a.cfg.StateDir, "tasks.json")); err != nil {
		// Not worth refusing to start over: at worst a task runs again.
		a.log.Error("control task ledger damaged; starting an empty one", zap.Error(err))
	}
	a.loadEncryptionKey()
	a.enrollment, a.source = EnrollmentEnrolled, a.client
	a.log.Info("enrolled edge", zap.String("edge", id.EdgeID), zap.String("control", id.ControlURL))
	return nil
}

// unusable records an enrolled identity that cannot be used: the cells
// still serve their verified releases from disk (a damaged identity must not
// take customer traffic down), nothing is polled, and status says why.
func (a *Agent) unusable(err error) {
	a.enrollment, a.controlErr = EnrollmentUnusable, err.Error()
	a.log.Error("enrolled identity unusable: serving the releases on disk, polling nothing; enroll again (cellvisor enroll --replace)", zap.Error(err))
}

// setupActivation prepares the ack journal and the activator.
func (a *Agent) setupActivation(topo runtime.Topology, assign runtime.Assignments) error {
	var err error
	a.acks, err = controlclient.OpenJournal(filepath.Join(a.cfg.StateDir, "acks.journal"), a.log)
	if err != nil {
		return err
	}
	// The limits of the last signed assignments, persisted with them.
	limits, err := runtime.LoadPoolLimits(a.cfg.StateDir)
	if err != nil {
		return err
	}
	a.act, err = activation.New(activation.Options{
		EdgeID: a.id.EdgeID, PublicKey: a.key, Source: a.source, Journal: a.acks,
		Topology: topo, Assignments: assign, PoolLimits: limits, Cells: a.sup, StateDir: a.cfg.StateDir,
		ApplyTimeout: a.cfg.Source.ApplyTimeout.D(), PollTimeout: a.cfg.Source.PollTimeout.D(), Logger: a.log,
		EncryptionKeys: func() ([]*ecdh.PrivateKey, error) { return controlclient.EncryptionKeys(a.cfg.IdentityDir()) },
		Render: func(s runtime.Slot, pool string, seq int64) runtime.RenderParams {
			return RenderParams(a.cfg, s, pool, seq)
		},
	})
	return err
}

// longPoll is how long the agent lets the control API hold a poll: 90 s,
// within half the poll's own bound (source.poll_timeout), which also
// covers the pages and artifacts fetched after it.
func longPoll(pollTimeout time.Duration) time.Duration {
	return min(90*time.Second, pollTimeout/2)
}
