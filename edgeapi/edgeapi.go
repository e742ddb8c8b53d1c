// Package edgeapi is the wire contract of the edge-control API between
// cellvisor-control (controlapi) and the agent (controlclient): the paths,
// the headers and the request and response bodies. It holds no logic; both
// sides import it so that they cannot drift apart. Any package may import
// it.
//
// Every path but Enroll needs a client certificate issued at enrollment
// (CN = edge UUID). Manifest pages and artifacts use the types of package
// manifest.
//
// # Strict where signed, lenient elsewhere
//
// What the control API sends an agent is decoded in one of two ways, so
// that a newer control API does not break older agents while nothing that
// is signed can carry what the signature does not cover:
//
//   - Strict (unknown fields refused, trailing data refused, hard bounds):
//     everything signed or that selects what is signed: manifest pages and
//     their entries (manifest.ParsePage), artifacts (exact bytes, checked
//     for size, SHA-256 and signature), and recovery snapshots with their
//     manifest.json (manifest.ReadSnapshot). A field this agent does not
//     know in a page is a refusal, acknowledged as such.
//   - Lenient (unknown fields ignored, still bounded in size): everything
//     else: EnrollResponse (its certificate and key are checked on their
//     own), []Task, error bodies (ErrorBody, or plain text), and any answer
//     to an ack, task ack or status report. A control API may add fields
//     to these; an older agent ignores them.
//
// The control API reads what agents send it the same way: acks and task
// acks strictly, status reports leniently (Summary).
package edgeapi

import (
	"encoding/json"
	"time"
)

// Paths of the edge-control API.
const (
	// PathEnroll takes an EnrollRequest (POST) and answers an
	// EnrollResponse. It is the only path served without a client
	// certificate.
	PathEnroll = "/v1/enroll"
	// PathRenew takes a RenewRequest (POST), authenticated by the edge's
	// current client certificate, and answers a RenewResponse. The new
	// certificate is pending until the edge first uses it: that request
	// makes it current and revokes the old one.
	PathRenew = "/v1/renew"
	// PathManifest serves a manifest.Page (GET ?after=SEQ&cursor=C). With
	// If-None-Match: "SEQ" and no newer manifest it answers 304 Not
	// Modified and no body: the cheap poll.
	PathManifest = "/v1/manifest"
	// PathArtifacts + sha256 serves an artifact's bytes (GET).
	PathArtifacts = "/v1/artifacts/"
	// PathSnapshot serves the gzip'd recovery snapshot (GET), 404 when the
	// edge has no manifest yet.
	PathSnapshot = "/v1/snapshot"
	// PathAcks takes a manifest.Ack (POST); 204.
	PathAcks = "/v1/acks"
	// PathStatus takes a StatusReport (POST); 204.
	PathStatus = "/v1/status"
	// PathEncryptionKey takes an EncryptionKeyRequest (PUT): the edge's
	// encryption public key, which certificates' keys are sealed to. An
	// edge enrolled before it registered one at enrollment sends it here.
	PathEncryptionKey = "/v1/encryption-key"
	// PathTasks lists the edge's pending control tasks (GET, []Task);
	// PathTasks + "{id}/ack" takes a TaskAck (POST); 204.
	PathTasks = "/v1/tasks/"
	// PathFrontDoors serves the front doors of the edge's org (GET,
	// FrontDoors), for its cells' Lua resolver. With If-None-Match: the
	// ETag of the last answer and nothing changed, it answers 304 Not
	// Modified and no body.
	PathFrontDoors = "/v1/frontdoors"
)

// Headers.
const (
	// HeaderTasks, on manifest answers (304s included), is the number of
	// control tasks pending for the edge, so that the agent asks for tasks
	// only when there are some.
	HeaderTasks = "X-Cellvisor-Tasks"
	// HeaderStatusInterval, on manifest answers (304s included), is the
	// longest in seconds the agent goes without sending its status while
	// nothing in it changed (a change is sent at once). The agent keeps
	// it within MinStatusInterval–MaxStatusInterval, and uses
	// DefaultStatusInterval until a control API assigns one.
	HeaderStatusInterval = "X-Cellvisor-Status-Interval"
)

// Status reports: the poll is the heartbeat (last seen), and the status
// is sent when it changes and otherwise every status interval.
const (
	DefaultStatusInterval = 5 * time.Minute
	MinStatusInterval     = 30 * time.Second
	MaxStatusInterval     = 30 * time.Minute
)

// Admission: a request class the control API is serving its limit of
// answers 429 Too Many Requests with a Retry-After in seconds (1–5,
// chosen at random); a replica stopping answers 503 with one. The agent
// waits at least that long, plus jitter, before it sends that class
// again, and at most MaxRetryAfter; DefaultRetryAfter when a 429 names
// none.
const (
	DefaultRetryAfter = 5 * time.Second
	MaxRetryAfter     = 5 * time.Minute
)

// Long polls.
const (
	// QueryWait, on a first-page conditional poll (?after=SEQ&wait=S), asks
	// the control API to hold the poll up to S seconds while nothing is
	// newer than SEQ and no task is pending: it answers as soon as either
	// changes, else 304 at the end (a little before S, jittered). A control
	// API that does not know it answers at once, as for a plain poll.
	QueryWait = "wait"
	// MaxWait is the longest hold asked for; more is held this long.
	MaxWait = 120 * time.Second
)

// Bounds on bodies the control API accepts from an edge, and (enrollment
// and tasks) on the answers an edge reads.
const (
	MaxEnrollBytes = 64 << 10
	MaxStatusBytes = 1 << 20
	MaxAckBytes    = 64 << 10
	MaxTasksBytes  = 1 << 20
	// MaxFrontDoorsBytes bounds a FrontDoors answer the agent reads.
	MaxFrontDoorsBytes = 4 << 20
	// MaxGateways bounds the gateways one status report carries.
	MaxGateways = 64
)

// ErrorBody is the body of an error answer: read leniently, and as plain
// text when it is not JSON.
type ErrorBody struct {
	Error string `json:"error"`
}

// EnrollRequest is an enrollment: the one-time bootstrap token and a
// PEM-encoded certificate signing request for the key the agent generated.
type EnrollRequest struct {
	Token string `json:"token"`
	CSR   string `json:"csr"`
	// EncryptionKey is the edge's X25519 encryption public key, standard
	// base64 (tlsseal.EncodePublic): the control API seals certificates'
	// keys to it. Part of an exact retry, as the CSR is.
	EncryptionKey string `json:"encryption_key,omitempty"`
}

// EncryptionKeyRequest registers an edge's encryption public key.
type EncryptionKeyRequest struct {
	EncryptionKey string `json:"encryption_key"`
}

// EnrollResponse is the identity an edge persists.
type EnrollResponse struct {
	EdgeID string `json:"edge_id"`
	// Certificate is the PEM client certificate: CN = EdgeID, no IP SANs.
	Certificate string `json:"certificate"`
	// CA is the PEM certificate of the control plane's CA, which issued it.
	CA string `json:"ca"`
	// ControlPublicKey is the standard base64 Ed25519 key that signs this
	// edge's artifacts; the agent pins it.
	ControlPublicKey string `json:"control_public_key"`
	// Slots is the edge's slot count, fixed at creation.
	Slots int `json:"slots"`
	// Org is the edge's organization (its bundles' org); empty from an
	// older control API.
	Org string `json:"org,omitempty"`
}

// RenewRequest asks for a new client certificate: a PEM-encoded CSR for a
// new key. As at enrollment, the CSR's subject and extensions are ignored:
// the certificate names the edge its current certificate names. Sending
// the same CSR again (an answer lost) gets the same certificate.
type RenewRequest struct {
	CSR string `json:"csr"`
}

// RenewResponse is the renewed certificate.
type RenewResponse struct {
	// Certificate is the PEM client certificate: CN = the edge id, no IP
	// SANs, valid for the control plane's client certificate lifetime.
	Certificate string `json:"certificate"`
	// CA is the PEM certificate of the CA that issued it.
	CA string `json:"ca"`
}

// Task is a control task for one cell of the edge.
type Task struct {
	ID        int64     `json:"id"`
	Cell      string    `json:"cell"`
	Action    string    `json:"action"`
	CreatedAt time.Time `json:"created_at"`
}

// Task actions.
const (
	ActionDrain   = "drain"
	ActionUndrain = "undrain"
	ActionRestart = "restart"
)

// Task states.
const (
	TaskPending = "pending"
	TaskDone    = "done"
	TaskFailed  = "failed"
)

// ValidAction reports a known task action.
func ValidAction(a string) bool {
	return a == ActionDrain || a == ActionUndrain || a == ActionRestart
}

// TaskAck is what became of a task.
type TaskAck struct {
	// State is TaskDone or TaskFailed.
	State string `json:"state"`
	// Result says why a task failed, or the cell's state after it.
	Result string `json:"result,omitempty"`
}

// StatusReport is the agent's periodic report: its status as its admin
// socket serves it (slots, readiness, capacity, passive-origin summaries,
// security events). The control plane reads it leniently (Summary), so that
// newer agents can add fields.
type StatusReport struct {
	At     time.Time       `json:"at"`
	Status json.RawMessage `json:"status"`
	// Gateways are the edge's public services, with its topology and
	// health; absent (nil) leaves the control API's rows as they are. A
	// gateway carries no front-door URL: only an operator sets one.
	Gateways []Gateway `json:"gateways,omitempty"`
}

// Gateway is one public service group of the edge, as its agent reports it.
type Gateway struct {
	// Service names the group: "http" or "https" (the cells' public
	// listeners).
	Service  string `json:"service"`
	Protocol string `json:"protocol"`
	// Host is the address the listeners bind ("" for all addresses); Port
	// the first cell's port of the group.
	Host string `json:"host"`
	Port int    `json:"port"`
	TLS  bool   `json:"tls"`
	MTLS bool   `json:"mtls"`
	// Region, Zone and Locality are the edge's topology (agent.yaml).
	Region   string `json:"region,omitempty"`
	Zone     string `json:"zone,omitempty"`
	Locality string `json:"locality,omitempty"`
	Priority int    `json:"priority"`
	CostTier int    `json:"cost_tier"`
	Weight   int    `json:"weight"`
	// RTTMicros is the agent's last measured round trip to the control
	// API, in microseconds (0 before one).
	RTTMicros int64 `json:"rtt_us"`
	// Healthy: at least one assigned cell of the group is ready.
	Healthy bool `json:"healthy"`
}

// FrontDoors are the active front doors of the edge's org: what its cells
// resolve a front-door URL against (frontdoor.Resolve and its Lua twin).
type FrontDoors struct {
	Org  string         `json:"org"`
	Rows []FrontDoorRow `json:"rows"`
}

// FrontDoorRow is one front door: its canonical URL and its edge.
type FrontDoorRow struct {
	Edge string `json:"edge"`
	URL  string `json:"url"`
}

// Summary is the part of an agent's status the control plane reads.
type Summary struct {
	Version    string `json:"version"`
	CgroupMode string `json:"cgroup_mode"`
	Control    *struct {
		ActiveSequence int64 `json:"active_sequence"`
	} `json:"control"`
	// Egress is the agent's intake address and destination probes.
	Egress *EgressReport `json:"egress,omitempty"`
	// Runtime is the cells' binary: its version, the cells still running
	// a replaced one, and the roll onto it.
	Runtime *struct {
		Version    string `json:"version"`
		Superseded int    `json:"superseded"`
		Upgrade    string `json:"upgrade"`
		Reason     string `json:"reason"`
	} `json:"runtime"`
	Slots []struct {
		Name     string `json:"name"`
		Pool     string `json:"pool"`
		State    string `json:"state"`
		Reason   string `json:"reason"`
		Drained  bool   `json:"drained"`
		Sequence int64  `json:"sequence"`
		// HTTPPort is the cell's HTTP listener (the routing view's port).
		HTTPPort int `json:"http_port"`
		// Runtime is the binary the cell's master runs.
		Runtime *struct {
			Version    string `json:"version"`
			Superseded bool   `json:"superseded"`
		} `json:"runtime"`
		Cell *struct {
			Security struct {
				AuthFailures int64   `json:"auth_failures"`
				LastAt       float64 `json:"last_at"`
				LastReason   string  `json:"last_reason"`
			} `json:"security"`
			// TLS is the cell's certificates, summed up.
			TLS struct {
				Count   int `json:"count"`
				Soonest *struct {
					Domain   string `json:"domain"`
					NotAfter int64  `json:"not_after"`
				} `json:"soonest"`
			} `json:"tls"`
		} `json:"cell"`
	} `json:"slots"`
}
