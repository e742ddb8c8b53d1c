// Package runtime owns everything a cell runs from on disk: the slot topology
// (ports and paths, persisted once and never changed), pool assignments, the
// domain configuration model, the per-pool runtime JSON the cells' Lua reads,
// the rendered nginx.conf, and releases switched atomically through the
// slot's `current` link. It starts no process; supervisor does.
// supervisor, activation, agent, cmd/cellvisor-demo and the tests' harness
// (testkit/testutil) import it.
package runtime
