package deptest

// The floors of the module, bottom up. A package sits on one floor and
// imports only packages on the floors its own may import (mayImport); an
// import the other way runs back up and is allowed only as a named
// exception (backUp, testBackUp).
type tier int

const (
	util    tier = iota // internal/: leaf utilities, the standard library's floor
	model               // what both sides share: the domain model, the wire contracts, pure decisions
	host                // the edge host's parts: cgroups, the join helper, systemd, logs, a cell's endpoint, the control client
	cells               // what runs the cells: runtime, supervisor, activation, the send path
	agent               // the agent's wiring and its metrics
	control             // the control plane: controlapi and its parts
	build               // the package builder
	cmd                 // the commands: nothing imports them
)

var tierNames = [...]string{"util", "model", "host", "cells", "agent", "control", "build", "cmd"}

func (t tier) String() string { return tierNames[t] }

// mayImport: for each floor, the floors its packages may import. The edge
// (host, cells, agent) and the control plane share util and model and
// nothing else.
var mayImport = map[tier][]tier{
	util:    {util},
	model:   {util, model},
	host:    {util, model, host},
	cells:   {util, model, host, cells},
	agent:   {util, model, host, cells, agent},
	control: {util, model, control},
	build:   {util, build},
	cmd:     {util, model, host, cells, agent, control, build, cmd},
}

// row places one package: its floor and who may import it.
type row struct {
	tier tier
	// only lists the packages that may import it (module-relative
	// paths), or nil to let any package whose floor may import this one.
	only []string
	// tests: nothing but tests imports it (a test harness or double).
	tests bool
}

// table holds every package of the module, by path relative to the
// module. A package missing from it fails TestTable: place it.
var table = map[string]row{
	// util: anyone may import these.
	"internal/atomicfile": {tier: util},
	"internal/backoff":    {tier: util},
	"internal/clock":      {tier: util},
	"internal/connlimit":  {tier: util},
	"internal/procstat":   {tier: util},
	"internal/safefile":   {tier: util},
	"internal/sysfile":    {tier: util},
	// util with one use each.
	"internal/buildid":  {tier: util, only: []string{"runtime"}},
	"internal/celluser": {tier: util, only: []string{"agent", "supervisor"}},
	"internal/sockstat": {tier: util, only: []string{"supervisor"}},
	"internal/cli":      {tier: util, only: []string{"cmd/cellvisor", "cmd/cellvisor-control", "cmd/cellvisor-demo"}},
	// internal/ also holds test harnesses and doubles that import nothing
	// of the product; those that do live in testkit/ (below).
	"internal/deptest":     {tier: util, tests: true},
	"internal/fakesystemd": {tier: util, tests: true},
	"internal/testcert":    {tier: util, tests: true},
	"internal/pebbletest":  {tier: util, tests: true},

	// model: both sides import these.
	"domain":               {tier: model},
	"edgeapi":              {tier: model},
	"edgeapi/statusdigest": {tier: model, only: []string{"controlapi", "controlclient"}},
	"egress":               {tier: model},
	"frontdoor":            {tier: model},
	"manifest":             {tier: model},
	"placement":            {tier: model},
	"tlsseal":              {tier: model, only: []string{"controlapi", "controlclient", "activation", "agent"}},

	// host.
	"cgexec":        {tier: host, only: []string{"cgroup", "supervisor", "agent", "testkit/floorspawn"}},
	"cgroup":        {tier: host, only: []string{"supervisor", "agent", "cmd/cellvisor", "cmd/cellvisor-demo", "testkit/testutil"}},
	"cellapi":       {tier: host, only: []string{"supervisor", "cmd/cellvisor-demo"}},
	"config":        {tier: host, only: []string{"agent", "cmd/cellvisor", "cmd/cellvisor-demo"}},
	"controlclient": {tier: host, only: []string{"activation", "outbound", "agent", "cmd/cellvisor"}},
	"logbound":      {tier: host, only: []string{"supervisor", "agent"}},
	"runtimebin":    {tier: host, only: []string{"supervisor"}},
	"sdscope":       {tier: host, only: []string{"agent", "cmd/cellvisor"}},
	"systemd":       {tier: host, only: []string{"agent", "cmd/cellvisor-control"}},

	// cells.
	"runtime":               {tier: cells, only: []string{"supervisor", "activation", "agent", "cmd/cellvisor-demo", "testkit/testutil"}},
	"supervisor":            {tier: cells, only: []string{"adminsock", "agent", "agentmetrics", "cmd/cellvisor", "cmd/cellvisor-demo"}},
	"adminsock":             {tier: cells, only: []string{"agent", "cmd/cellvisor"}},
	"activation":            {tier: cells, only: []string{"agent", "agentmetrics"}},
	"outbound":              {tier: cells, only: []string{"agent", "agentmetrics"}},
	"outbound/outboundtest": {tier: cells, tests: true},

	// agent.
	"agentmetrics": {tier: agent, only: []string{"agent"}},
	"agent":        {tier: agent, only: []string{"cmd/cellvisor"}},

	// control: the server wires its parts; no part imports it.
	"controlapi":           {tier: control, only: []string{"cmd/cellvisor-control", "cmd/cellvisor-demo"}},
	"controlapi/acmeissue": {tier: control, only: []string{"controlapi"}},
	"controlapi/adminapi":  {tier: control, only: []string{"controlapi", "controlapi/fleet", "controlapi/store", "cmd/cellvisor-control", "cmd/cellvisor-demo"}},
	"controlapi/certcheck": {tier: control, only: []string{"controlapi"}},
	"controlapi/fleet":     {tier: control, only: []string{"controlapi"}},
	"controlapi/lease":     {tier: control, only: []string{"controlapi"}},
	"controlapi/metrics":   {tier: control, only: []string{"controlapi"}},
	"controlapi/pki":       {tier: control, only: []string{"controlapi"}},
	"controlapi/snapcache": {tier: control, only: []string{"controlapi"}},
	"controlapi/store":     {tier: control, only: []string{"controlapi", "controlapi/lease"}},

	// build.
	"packaging": {tier: build, only: []string{"packaging/cmd/mkpkg"}},

	// cmd.
	"cmd/cellvisor":         {tier: cmd},
	"cmd/cellvisor-control": {tier: cmd},
	"cmd/cellvisor-demo":    {tier: cmd},
	"packaging/cmd/mkpkg":   {tier: cmd},
	"scripts/vm/vmload":     {tier: cmd},

	// testkit: the test harnesses that import the product, each on the
	// floor of what it imports (issue 33 moved them out of internal/).
	"testkit/testutil":   {tier: cells, tests: true},                          // a fresh cgroup subtree per test (cgroup), OpenResty and free ports (runtime)
	"testkit/corpingest": {tier: model, only: []string{"cmd/cellvisor-demo"}}, // the egress test destination: decodes the agents' bundles (edgeapi)
	"testkit/floorspawn": {tier: cmd},                                         // a command: a benchmark's floor, starts cells through the agent's join helper (cgexec)
}

// backUp: the imports (not tests') that run back up the floors today,
// each allowed by its row but not by the floors: none since issue 33 moved
// the harnesses that imported the product out of internal/ (testkit/).
// Add none; TestTable fails on an entry that no longer occurs.
var backUp = map[string]string{}

// testBackUp: tests' direct imports that run back up the floors today.
// Tests are held to the floors only (a row's only list binds non-test
// code), so an end-to-end test under cmd/ may import anything; these
// are the tests below cmd/ that reach up.
var testBackUp = map[string]string{
	"supervisor -> agent":         "supervisor's harness renders cells and limits as the agent does (RenderParams, CellLimits)",
	"controlapi -> controlclient": "controlapi's tests drive the edge-control API through the agent's client",
	"packaging -> cgexec":         "packaging's tests build the agent with the join helper's link flags",
}
