package agentmetrics

// Every series the collector sends; docs/observability.md lists them with
// their meaning, and a test checks the two agree.
var (
	cellLabels = []string{"cell", "pool"}

	agentInfo          = desc("agent_info", "The agent's version and how cell limits are enforced (cgroup_mode: v2, v1-hybrid, unenforced); always 1.", "version", "cgroup_mode")
	limitsEnforced     = desc("agent_limits_enforced", "1 when cell limits are enforced by cgroups, 0 when cells run without limits.")
	startTime          = desc("agent_start_time_seconds", "When the agent started, as a Unix timestamp.")
	enrollmentState    = desc("agent_enrollment_state", "1 for the agent's enrollment state, 0 for the others: enrolled, not_enrolled, spool, unusable (enrolled, identity damaged), standalone (no manifest source).", "state")
	activeSequence     = desc("manifest_active_sequence", "The sequence of the active manifest (0: none yet).")
	ackPending         = desc("ack_journal_pending", "Acks journaled but not yet taken by the control API or spool.")
	ackDropped         = desc("ack_journal_dropped_total", "Damaged ack journal lines dropped when the agent started.")
	controlLastSuccess = desc("control_last_success_timestamp_seconds", "When the control API last answered the agent (any call), as a Unix timestamp.")
	pollLast           = desc("poll_last_timestamp_seconds", "When the last poll of the manifest source ended, as a Unix timestamp.")
	pollFailing        = desc("poll_failing", "1 when the last poll of the manifest source failed (unreachable, local I/O); a refusal is not a failure.")
	pollLastSuccess    = desc("poll_last_success_timestamp_seconds", "When a poll of the manifest source last ended without error, as a Unix timestamp.")
	certExpiry         = desc("cert_expiry_timestamp_seconds", "When the edge's client certificate expires, as a Unix timestamp.")
	frontDoorRows      = desc("frontdoor_rows", "Front doors of the edge's org in the cells' runtime file (the last answer taken).")
	frontDoorFetched   = desc("frontdoor_last_fetch_timestamp_seconds", "When the control API last confirmed or changed the front doors, as a Unix timestamp.")
	runtimeInfo        = desc("runtime_info", "The version the cells' binary reports (-v; empty until known); always 1.", "version")
	frontDoorFailing   = desc("frontdoor_fetch_failing", "1 when the last front-door fetch failed or its answer was refused (the previous rows stay).")

	activationLastDuration = desc("activation_last_duration_seconds", "How long the last activation took, from the start of the poll that found it to its ack in the journal.")
	activationLastTime     = desc("activation_last_timestamp_seconds", "When the last activation ended, as a Unix timestamp.")
	activationLastSequence = desc("activation_last_sequence", "The manifest sequence of the last activation (0: a refused snapshot with no readable sequence).")
	activationLastOutcome  = desc("activation_last_outcome", "1 for the last activation's outcome, 0 for the others: applied, partial, refused, failed.", "outcome")
	activations            = desc("activations_total", "Activations since the agent started, by outcome.", "outcome")
	refusals               = desc("activation_refusals_total", "Manifests and snapshots refused since the agent started, by reason class (each refused sequence once).", "reason")

	cellInfo             = desc("cell_info", "A cell slot's pool (empty when unassigned) and assignment (assigned, unassigned); always 1.", "cell", "pool", "assignment")
	cellState            = desc("cell_state", "1 for the cell's runtime state, 0 for the others: ready, degraded, drained, stopped, waiting (for its first release from the manifest source).", "cell", "pool", "state")
	cellReady            = desc("cell_ready", "1 when the cell is ready (running, answering its readiness check, not drained).", cellLabels...)
	cellDrained          = desc("cell_drained", "1 when the cell is drained by the operator or a control task.", cellLabels...)
	cellUp               = desc("cell_up", "1 when the cell has a running master process.", cellLabels...)
	cellRestarts         = desc("cell_restarts_total", "Restarts of the cell: after crashes (kind=crash) and by the operator or control tasks (kind=operator); kept across agent restarts.", "cell", "pool", "kind")
	cellSequence         = desc("cell_release_sequence", "The release sequence the cell last reported loading.", cellLabels...)
	cellMemory           = desc("cell_memory_bytes", "Memory the cell's cgroup uses (memory.current on v2, memory.usage_in_bytes on v1).", cellLabels...)
	cellMemoryLimit      = desc("cell_memory_limit_bytes", "The cell's memory limit.", cellLabels...)
	cellCPU              = desc("cell_cpu_seconds_total", "CPU time the cell's cgroup used (cpu.stat usage_usec on v2, cpuacct.usage on v1).", cellLabels...)
	cellCPULimit         = desc("cell_cpu_limit_cpus", "The cell's CPU limit, in CPUs (quota / period).", cellLabels...)
	cellThrottled        = desc("cell_cpu_throttled_seconds_total", "Time the cell's tasks were throttled by its CPU limit.", cellLabels...)
	cellThrottledPeriods = desc("cell_cpu_throttled_periods_total", "CPU periods in which the cell was throttled.", cellLabels...)
	cellOverloaded       = desc("cell_overloaded", "1 when the cell's last liveness check found it alive but taking no more connections (every one it can hold is held): it is not restarted for it.", cellLabels...)
	cellOverloads        = desc("cell_overloaded_checks_total", "Liveness checks that found the cell overloaded, since it started.", cellLabels...)
	cellPIDs             = desc("cell_pids", "Tasks in the cell's cgroup.", cellLabels...)
	cellPIDsLimit        = desc("cell_pids_limit", "The cell's task limit.", cellLabels...)
	cellPIDsRefused      = desc("cell_pids_refused_total", "Forks the cell's task limit refused.", cellLabels...)
	cellOOM              = desc("cell_oom_kills_total", "Processes of the cell killed by the kernel's OOM killer at its memory limit.", cellLabels...)
	cellDisk             = desc("cell_disk_bytes", "Bytes the cell holds on disk against each budget (cache, request_tmp, logs), as the agent last measured them: the files there and the cell's open files there, unlinked ones included.", "cell", "pool", "budget")
	cellDiskUnlinked     = desc("cell_disk_unlinked_bytes", "Of cell_disk_bytes, the bytes in files no longer in the directory, held only by the cell's open descriptors (du does not see them).", "cell", "pool", "budget")
	cellDiskBudget       = desc("cell_disk_budget_bytes", "The cell's disk budgets: limits.cache, limits.request_tmp, limits.logs.", "cell", "pool", "budget")
	cellCacheWakes       = desc("cell_cache_manager_wakes_total", "Times the agent woke the cell's cache manager because the cache was over its target (three quarters of limits.cache), since the agent started.", cellLabels...)
	cellBodiesHeld       = desc("cell_request_bodies_held_bytes", "Bytes the cell has reserved for the request bodies in progress against limits.request_tmp.", cellLabels...)
	cellBodiesRefused    = desc("cell_request_bodies_refused_total", "Request bodies the cell refused with 503 because they would have taken it past limits.request_tmp.", cellLabels...)
	cellLogBytes         = desc("cell_log_bytes", "Bytes in the cell's logs directory (bounded by limits.logs).", cellLabels...)
	cellReportOK         = desc("cell_report_ok", "1 when the running cell answered its private status call during this scrape; the series below are left out when it did not.", cellLabels...)
	cellConns            = desc("cell_connections", "The cell's client connections by state (nginx stub status: active, reading, writing, waiting).", "cell", "pool", "state")
	cellRequests         = desc("cell_requests_total", "Requests the cell served since its master started (resets when the cell restarts).", cellLabels...)
	cellLimited          = desc("cell_limit_refused_total", "Requests the pool limits refused, by kind: connections (503) and rate (429).", "cell", "pool", "kind")
	cellOriginFailures   = desc("cell_origin_failures_total", "Passive-origin failures the cell saw while proxying, over every origin (no per-domain series), by reason: connect_failed, connect_timeout, resolve, read_timeout, reset, bad_answer, http_5xx (unknown: counted by a cell that gave none).", "cell", "pool", "reason")
	cellRuntimeInfo      = desc("cell_runtime_info", "The version of the binary the cell's master runs (empty: not known); always 1; running cells only.", "cell", "pool", "version")
	cellSuperseded       = desc("cell_runtime_superseded", "1 when the cell's master runs a binary replaced at its path since it started (a package upgrade); running cells only.", cellLabels...)
	cellSecurity         = desc("cell_security_events_total", "Refused (unauthenticated or wrongly signed) calls to the cell's private endpoint.", cellLabels...)
	cellLoads            = desc("cell_loads_total", "Releases the cell loaded as data, without a reload, since its master started.", cellLabels...)
	cellLoadFailures     = desc("cell_load_failures_total", "Releases the cell could not load (it kept serving what it had), since its master started.", cellLabels...)
	cellReloads          = desc("cell_reloads_total", "Graceful reloads the agent sent the cell (a new worker generation each), since the agent started.", cellLabels...)
	cellCut              = desc("cell_requests_cut_total", "Requests the cell's workers ended unfinished when their shutdown grace ran out (after a reload, or at a stop), since its master started.", cellLabels...)
	cellLuaHeap          = desc("cell_lua_heap_bytes", "The answering worker's Lua heap: mostly the data it serves.", cellLabels...)
	cellOriginDown       = desc("cell_origin_servers_down", "Origin servers the cell skips now (their requests kept failing, or their active health check fails), over every origin (which: cellvisor status, origin_servers).", cellLabels...)
	cellOriginRetries    = desc("cell_origin_retries_total", "Requests the cell tried again on another server of their origin, over every origin.", cellLabels...)
	cellOriginChecks     = desc("cell_origin_health_checks_total", "Active health checks of origin servers the cell made, by result: passed, failed.", "cell", "pool", "result")
	cellCerts            = desc("cell_tls_certificates", "Certificates the cell presents on its HTTPS port (one a domain; `cellvisor status` lists them with their expiry).", cellLabels...)
	cellCertExpiry       = desc("cell_tls_certificate_expiry_min_timestamp_seconds", "The soonest expiry (Unix seconds) among the certificates the cell presents; absent where it presents none.", cellLabels...)
	cellTLSRefused       = desc("cell_tls_handshakes_refused_total", "TLS handshakes the cell refused, by reason: unknown_name (SNI of a host it has no certificate for), no_name (no SNI), bad_certificate (the domain's certificate or key did not parse).", "cell", "pool", "reason")

	allDescs = []*Desc{
		agentInfo, limitsEnforced, startTime, enrollmentState, activeSequence, ackPending, ackDropped,
		controlLastSuccess, pollLast, pollFailing, pollLastSuccess, certExpiry, frontDoorRows, frontDoorFetched, frontDoorFailing,
		activationLastDuration, activationLastTime, activationLastSequence, activationLastOutcome, activations, refusals,
		cellInfo, cellState, cellReady, cellDrained, cellUp, cellRestarts, cellSequence, cellMemory, cellMemoryLimit,
		cellCPU, cellCPULimit, cellThrottled, cellThrottledPeriods, cellPIDs, cellPIDsLimit, cellPIDsRefused, cellOOM,
		cellLogBytes, cellDisk, cellDiskUnlinked, cellDiskBudget, cellCacheWakes, cellBodiesHeld, cellBodiesRefused, cellReportOK, cellConns, cellRequests, cellLimited, cellOriginFailures, cellSecurity, cellOverloaded, cellOverloads,
		cellLoads, cellLoadFailures, cellReloads, cellCut, cellLuaHeap, cellCerts, cellCertExpiry, cellTLSRefused,
		cellOriginDown, cellOriginRetries, cellOriginChecks,
		runtimeInfo, cellRuntimeInfo, cellSuperseded,
	}
)

func desc(name, help string, labels ...string) *Desc {
	return &Desc{name: ns + "_" + name, help: help, labels: labels}
}
