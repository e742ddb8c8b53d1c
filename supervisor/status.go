package supervisor

import (
	"time"

	"cellvisor/cellapi"
	"cellvisor/cgroup"
	"cellvisor/edgeapi"
)

// State is a slot's runtime state.
type State string

// Runtime states, as the seed names them.
const (
	StateReady    State = "ready"
	StateDegraded State = "degraded"
	StateDrained  State = "drained"
	StateStopped  State = "stopped"
	// StateWaiting is an assigned slot that has never had a release, while
	// a manifest source is to deliver one (Supervisor.ExpectReleases): a
	// freshly enrolled edge before its first manifest.
	StateWaiting State = "waiting"
)

// Assignment states.
const (
	Assigned   = "assigned"
	Unassigned = "unassigned"
)

// OriginReasons are the reasons a cell gives an origin's failure
// (cellapi.OriginReasons), for the agent's metrics.
var OriginReasons = cellapi.OriginReasons

// SlotStatus is one slot as the admin endpoint reports it.
type SlotStatus struct {
	Name       string `json:"name"`
	Pool       string `json:"pool,omitempty"`
	Assignment string `json:"assignment"`
	State      State  `json:"state"`
	Reason     string `json:"reason,omitempty"`
	PID        int    `json:"pid,omitempty"`
	HTTPPort   int    `json:"http_port"`
	HTTPSPort  int    `json:"https_port"`
	Cgroup     string `json:"cgroup,omitempty"`
	// CgroupPaths is the cell's group in each hierarchy, by controller: on
	// a hybrid host cpu, pids and cpuacct may sit elsewhere than memory.
	CgroupPaths map[string]string `json:"cgroup_paths,omitempty"`
	Limits      cgroup.Limits     `json:"limits"`
	Usage       *cgroup.Usage     `json:"usage,omitempty"`
	// Restarts counts restarts after crashes; OperatorRestarts the operator
	// restarts (cellvisor restart, control tasks) the rate limit admitted.
	Restarts         int `json:"restarts"`
	OperatorRestarts int `json:"operator_restarts"`
	// Liveness is the running cell's liveness checks, once there were any.
	Liveness   *LivenessStatus `json:"liveness,omitempty"`
	LastExit   string          `json:"last_exit,omitempty"`
	ReadySince *time.Time      `json:"ready_since,omitempty"`
	// Sequence is the release sequence the running cell reports serving
	// (0 until it has: stopped, or just started); CurrentSequence the one
	// switched in for it. They differ while a load or reload is taking
	// effect, and for a cell that did not take its release (its state then
	// says so: behind.go).
	Sequence        int64 `json:"sequence"`
	CurrentSequence int64 `json:"current_sequence"`
	Drained         bool  `json:"drained"`
	// Applied is how the cell took its last switched release: loaded as
	// data, reloaded (and why), or started.
	Applied *Applied `json:"applied,omitempty"`
	// Reloads counts the graceful reloads sent to the cell since the agent
	// started (each a new worker generation; a load is none).
	Reloads int64 `json:"reloads"`
	// Cell is the running cell's own report from its private endpoint
	// (connections, requests, passive-origin failures, security events).
	Cell *cellapi.Status `json:"cell,omitempty"`
	// Disk is what the assigned cell holds on disk against each budget, as
	// the agent last measured it (at most a couple of seconds old).
	Disk      *DiskUse `json:"disk,omitempty"`
	CellError string   `json:"cell_error,omitempty"`
	// Runtime is the binary the running master executes; nil when none
	// runs or its file cannot be told.
	Runtime *CellRuntime `json:"runtime,omitempty"`
}

// CellRuntime is the OpenResty binary a running cell's master executes.
type CellRuntime struct {
	// Version is what the binary said (-v) when the master started; ""
	// when not known (started by an agent that did not record it).
	Version string `json:"version,omitempty"`
	// Superseded says the file the master runs was replaced at its path
	// (a package upgrade): it runs the old binary until it is rolled onto
	// the new one. Current is the version the path holds now.
	Superseded bool   `json:"superseded"`
	Current    string `json:"current,omitempty"`
}

// RuntimeStatus is the binary the agent starts cells from.
type RuntimeStatus struct {
	Binary string `json:"binary"`
	// Version is what the binary says (-v); "" until known.
	Version string `json:"version,omitempty"`
	// Superseded counts the running cells whose master runs a replaced
	// binary.
	Superseded int `json:"superseded"`
	// Upgrade is the roll onto a new binary: "" (nothing to do, or done),
	// "rolling", "refused" (it failed verification: no cell was touched),
	// "failed" (a rolled cell did not come back ready: the roll stopped),
	// "waiting" (runtime_upgrade: manual); Reason says why.
	Upgrade string `json:"upgrade,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Status is the whole agent as the admin endpoint reports it.
type Status struct {
	Version    string      `json:"version"`
	PID        int         `json:"pid"`
	StartedAt  time.Time   `json:"started_at"`
	CgroupMode cgroup.Mode `json:"cgroup_mode"`
	CgroupPath string      `json:"cgroup_path,omitempty"`
	Enforced   bool        `json:"limits_enforced"`
	Refusal    string      `json:"refusal,omitempty"`
	// CellUsers is "slot" (each cell runs as its slot's own user) or
	// "agent", with why when that was not the configuration's choice.
	CellUsers string `json:"cell_users"`
	// Control is the manifest source's side, when one is configured.
	Control     *ControlStatus `json:"control,omitempty"`
	AgentLimits string         `json:"agent_limits,omitempty"`
	// Egress is the agent's send path, when it runs one.
	Egress *edgeapi.EgressStatus `json:"egress,omitempty"`
	// Runtime is the cells' OpenResty binary.
	Runtime *RuntimeStatus `json:"runtime,omitempty"`
	Slots   []SlotStatus   `json:"slots"`
}

// ControlStatus is the agent's configuration delivery.
type ControlStatus struct {
	// Enrollment is "enrolled", "not enrolled", "spool" (fed from a
	// directory) or "unusable" (enrolled, identity files damaged: Error).
	Enrollment string `json:"enrollment"`
	Error      string `json:"error,omitempty"`
	EdgeID     string `json:"edge_id,omitempty"`
	ControlURL string `json:"control_url,omitempty"`
	// LastSuccess is when the control API last answered.
	LastSuccess    *time.Time `json:"last_success,omitempty"`
	ActiveSequence int64      `json:"active_sequence"`
	LastPoll       *time.Time `json:"last_poll,omitempty"`
	LastPollError  string     `json:"last_poll_error,omitempty"`
	PendingAcks    int        `json:"pending_acks"`
	// CertExpires is when the edge's client certificate expires;
	// NextRenewal when the agent renews it next (or retries a failed
	// renewal, RenewalError saying why).
	CertExpires  *time.Time `json:"cert_expires,omitempty"`
	NextRenewal  *time.Time `json:"next_renewal,omitempty"`
	RenewalError string     `json:"renewal_error,omitempty"`
	// DroppedAcks counts damaged ack journal lines dropped at start.
	DroppedAcks int `json:"dropped_acks,omitempty"`
	// FrontDoors is the fetch of the org's front doors for the cells.
	FrontDoors *FrontDoorStatus `json:"front_doors,omitempty"`
}

// FrontDoorStatus is the agent's copy of its org's front doors: how many
// rows the cells resolve against, when they were last confirmed, and why
// the last answer was refused (the previous rows stay).
type FrontDoorStatus struct {
	Rows      int        `json:"rows"`
	LastFetch *time.Time `json:"last_fetch,omitempty"`
	Error     string     `json:"error,omitempty"`
}
