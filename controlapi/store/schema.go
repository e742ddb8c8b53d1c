package store

// migrations are applied in order, each once, each in its own transaction.
// Never edit one that has shipped: add the next. {{blob}} and {{bigint}} are
// the only spellings that differ between the dialects; {{now_ms}} is the
// time of the migration, in unix milliseconds.
var migrations = []string{
	// 1: edges, their identity and manifests; pools, domains, artifacts;
	// acknowledgements and control tasks.
	`
CREATE TABLE settings (
	name  TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
CREATE TABLE counters (
	name  TEXT PRIMARY KEY,
	value {{bigint}} NOT NULL
);
CREATE TABLE edges (
	id              TEXT PRIMARY KEY,
	name            TEXT NOT NULL UNIQUE,
	org             TEXT NOT NULL,
	country         TEXT NOT NULL,
	continent       TEXT NOT NULL,
	mgmt_ipv4       TEXT NOT NULL DEFAULT '',
	mgmt_ipv6       TEXT NOT NULL DEFAULT '',
	slots           INTEGER NOT NULL,
	token_hash      TEXT NOT NULL UNIQUE,
	csr_hash        TEXT NOT NULL DEFAULT '',
	cert_pem        TEXT NOT NULL DEFAULT '',
	cert_serial     TEXT NOT NULL DEFAULT '',
	rotations       INTEGER NOT NULL DEFAULT 0,
	sequence        {{bigint}} NOT NULL DEFAULT 0,
	active_sequence {{bigint}} NOT NULL DEFAULT 0,
	enrolled_at     {{bigint}} NOT NULL DEFAULT 0,
	last_seen       {{bigint}} NOT NULL DEFAULT 0,
	status          TEXT NOT NULL DEFAULT '',
	status_at       {{bigint}} NOT NULL DEFAULT 0,
	created_at      {{bigint}} NOT NULL,
	gen             {{bigint}} NOT NULL
);
CREATE INDEX edges_gen ON edges (gen);
CREATE TABLE pools (
	name       TEXT PRIMARY KEY,
	class      TEXT NOT NULL,
	created_at {{bigint}} NOT NULL
);
CREATE TABLE assignments (
	edge_id TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	cell    TEXT NOT NULL,
	pool    TEXT NOT NULL REFERENCES pools (name),
	PRIMARY KEY (edge_id, cell)
);
CREATE INDEX assignments_pool ON assignments (pool, edge_id);
CREATE TABLE artifacts (
	sha256     TEXT PRIMARY KEY,
	data       {{blob}} NOT NULL,
	created_at {{bigint}} NOT NULL
);
CREATE TABLE domains (
	name       TEXT PRIMARY KEY,
	pool       TEXT NOT NULL REFERENCES pools (name),
	revision   {{bigint}} NOT NULL,
	sha256     TEXT NOT NULL REFERENCES artifacts (sha256),
	size       {{bigint}} NOT NULL,
	deleted    INTEGER NOT NULL DEFAULT 0,
	updated_at {{bigint}} NOT NULL
);
-- An entry is in every sequence from from_seq up to, not including, to_seq
-- (0: still current), so a new sequence adds or closes rows and copies none.
CREATE TABLE manifest_entries (
	edge_id   TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	domain    TEXT NOT NULL,
	from_seq  {{bigint}} NOT NULL,
	to_seq    {{bigint}} NOT NULL DEFAULT 0,
	pool      TEXT NOT NULL,
	revision  {{bigint}} NOT NULL,
	size      {{bigint}} NOT NULL,
	sha256    TEXT NOT NULL,
	signature TEXT NOT NULL,
	PRIMARY KEY (edge_id, domain, from_seq)
);
CREATE INDEX manifest_entries_sha ON manifest_entries (edge_id, sha256);
CREATE TABLE acks (
	edge_id     TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	sequence    {{bigint}} NOT NULL,
	status      TEXT NOT NULL,
	reason      TEXT NOT NULL,
	cells       TEXT NOT NULL,
	at          {{bigint}} NOT NULL,
	received_at {{bigint}} NOT NULL,
	PRIMARY KEY (edge_id, sequence)
);
CREATE TABLE tasks (
	id         {{bigint}} PRIMARY KEY,
	edge_id    TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	cell       TEXT NOT NULL,
	action     TEXT NOT NULL,
	state      TEXT NOT NULL,
	result     TEXT NOT NULL DEFAULT '',
	created_at {{bigint}} NOT NULL,
	done_at    {{bigint}} NOT NULL DEFAULT 0
);
CREATE INDEX tasks_edge_state ON tasks (edge_id, state);
`,
	// 2: every hostname answers for one domain on every edge (the edges
	// refuse a manifest where two domains claim one). Domains published
	// before it claim theirs when next published.
	`
CREATE TABLE hostnames (
	hostname TEXT PRIMARY KEY,
	domain   TEXT NOT NULL
);
CREATE INDEX hostnames_domain ON hostnames (domain);
`,
	// 3: deleted edges, remembered by generation so that every replica's
	// poll cache drops them.
	`
CREATE TABLE deleted_edges (
	id  TEXT PRIMARY KEY,
	gen {{bigint}} NOT NULL
);
CREATE INDEX deleted_edges_gen ON deleted_edges (gen);
`,
	// 4: manifests authenticated as a whole: a signed header per edge
	// sequence; a signed rollback flag per entry; every revision's
	// artifact, for rollbacks, and the highest revision a domain had, so
	// that one published after a rollback still goes up; the signing key's
	// rotations, carried in every header.
	`
CREATE TABLE manifest_headers (
	edge_id   TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	sequence  {{bigint}} NOT NULL,
	header    TEXT NOT NULL,
	signature TEXT NOT NULL,
	PRIMARY KEY (edge_id, sequence)
);
ALTER TABLE manifest_entries ADD COLUMN rollback INTEGER NOT NULL DEFAULT 0;
ALTER TABLE domains ADD COLUMN top_revision {{bigint}} NOT NULL DEFAULT 0;
UPDATE domains SET top_revision = revision;
CREATE TABLE domain_revisions (
	domain     TEXT NOT NULL,
	revision   {{bigint}} NOT NULL,
	pool       TEXT NOT NULL,
	sha256     TEXT NOT NULL REFERENCES artifacts (sha256),
	size       {{bigint}} NOT NULL,
	created_at {{bigint}} NOT NULL,
	PRIMARY KEY (domain, revision)
);
INSERT INTO domain_revisions (domain, revision, pool, sha256, size, created_at)
	SELECT name, revision, pool, sha256, size, updated_at FROM domains;
INSERT INTO domain_revisions (domain, revision, pool, sha256, size, created_at)
	SELECT DISTINCT m.domain, m.revision, m.pool, m.sha256, m.size, 0 FROM manifest_entries m
	WHERE NOT EXISTS (SELECT 1 FROM domain_revisions r WHERE r.domain = m.domain AND r.revision = m.revision)
	AND EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = m.sha256);
CREATE TABLE key_rotations (
	id         INTEGER PRIMARY KEY,
	rotation   TEXT NOT NULL,
	created_at {{bigint}} NOT NULL
);
`,
	// 5: bootstrap tokens expire; a renewed client certificate waits as
	// pending until the edge first uses it. Tokens issued before get a day
	// from the upgrade ({{now_ms}}), as a new token gets by default.
	`
ALTER TABLE edges ADD COLUMN token_expires_at {{bigint}} NOT NULL DEFAULT 0;
ALTER TABLE edges ADD COLUMN pending_csr_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE edges ADD COLUMN pending_cert_pem TEXT NOT NULL DEFAULT '';
ALTER TABLE edges ADD COLUMN pending_serial TEXT NOT NULL DEFAULT '';
UPDATE edges SET token_expires_at = {{now_ms}} + 86400000;
`,
	// 6: placement. Pools carry their placement numbers and the limits
	// their cells enforce; a domain's cells on each edge are stored, as
	// placed (role active, target during a move, leaving while draining);
	// an entry names its cells; a header keeps the assignments it signs; a
	// domain's move between pools, with its steps.
	`
ALTER TABLE pools ADD COLUMN replicas INTEGER NOT NULL DEFAULT 1;
ALTER TABLE pools ADD COLUMN bound INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN min_ready INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN drain_ms {{bigint}} NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN max_conns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN rate INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN burst INTEGER NOT NULL DEFAULT 0;
ALTER TABLE manifest_entries ADD COLUMN cells TEXT NOT NULL DEFAULT '';
ALTER TABLE manifest_headers ADD COLUMN assignments TEXT NOT NULL DEFAULT '';
CREATE TABLE placements (
	domain     TEXT NOT NULL,
	edge_id    TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	cell       TEXT NOT NULL,
	pool       TEXT NOT NULL,
	role       TEXT NOT NULL,
	created_at {{bigint}} NOT NULL,
	PRIMARY KEY (domain, edge_id, cell)
);
CREATE INDEX placements_edge_pool ON placements (edge_id, pool, cell);
CREATE TABLE moves (
	domain      TEXT PRIMARY KEY,
	from_pool   TEXT NOT NULL,
	to_pool     TEXT NOT NULL,
	state       TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	steps       TEXT NOT NULL,
	started_at  {{bigint}} NOT NULL,
	deadline    {{bigint}} NOT NULL,
	drain_until {{bigint}} NOT NULL DEFAULT 0
);
CREATE INDEX moves_state ON moves (state);
`,
	// 7: a cell unassigned or reassigned while it holds domains drains
	// first: its domains are placed on the pool's other cells and
	// delivered there before the cell lets them go (a cell drain, with its
	// steps, per edge and cell).
	`
CREATE TABLE cell_drains (
	edge_id     TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	cell        TEXT NOT NULL,
	from_pool   TEXT NOT NULL,
	to_pool     TEXT NOT NULL,
	state       TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	domains     TEXT NOT NULL,
	steps       TEXT NOT NULL,
	started_at  {{bigint}} NOT NULL,
	deadline    {{bigint}} NOT NULL,
	drain_until {{bigint}} NOT NULL DEFAULT 0,
	PRIMARY KEY (edge_id, cell)
);
CREATE INDEX cell_drains_state ON cell_drains (state);
`,
	// 8: governed egress. Edges carry their topology (region, zone) and
	// ranking (priority, cost tier, weight), their intake URL and their
	// latest probes of each class's destination (edge_reach); each (org, class) has a policy, at most one
	// active lease (the partial unique index is the invariant), and a
	// fencing epoch that only grows, kept apart from the lease rows so
	// that pruning them never lets an epoch be reused.
	`
ALTER TABLE edges ADD COLUMN region TEXT NOT NULL DEFAULT '';
ALTER TABLE edges ADD COLUMN zone TEXT NOT NULL DEFAULT '';
ALTER TABLE edges ADD COLUMN priority INTEGER NOT NULL DEFAULT 100;
ALTER TABLE edges ADD COLUMN cost_tier INTEGER NOT NULL DEFAULT 0;
ALTER TABLE edges ADD COLUMN weight INTEGER NOT NULL DEFAULT 100;
ALTER TABLE edges ADD COLUMN egress_intake TEXT NOT NULL DEFAULT '';
CREATE INDEX edges_org ON edges (org, last_seen);
CREATE TABLE edge_reach (
	edge_id     TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	class       TEXT NOT NULL,
	destination TEXT NOT NULL,
	reachable   INTEGER NOT NULL,
	checked_at  {{bigint}} NOT NULL,
	PRIMARY KEY (edge_id, class)
);
CREATE TABLE egress_policies (
	org            TEXT NOT NULL,
	class          TEXT NOT NULL,
	destination    TEXT NOT NULL,
	region         TEXT NOT NULL DEFAULT '',
	require_region TEXT NOT NULL DEFAULT '',
	require_zone   TEXT NOT NULL DEFAULT '',
	updated_at     {{bigint}} NOT NULL,
	PRIMARY KEY (org, class)
);
CREATE TABLE egress_epochs (
	org   TEXT NOT NULL,
	class TEXT NOT NULL,
	epoch {{bigint}} NOT NULL,
	PRIMARY KEY (org, class)
);
CREATE TABLE egress_leases (
	org         TEXT NOT NULL,
	class       TEXT NOT NULL,
	epoch       {{bigint}} NOT NULL,
	holder      TEXT NOT NULL,
	active      INTEGER NOT NULL,
	acquired_at {{bigint}} NOT NULL,
	renewed_at  {{bigint}} NOT NULL,
	expires_at  {{bigint}} NOT NULL,
	ended_at    {{bigint}} NOT NULL DEFAULT 0,
	PRIMARY KEY (org, class, epoch)
);
CREATE UNIQUE INDEX egress_leases_one_active ON egress_leases (org, class) WHERE active = 1;
`,
	// 9: gateway rows per edge (front doors). The agent's status report
	// refreshes a row's service, topology, ranking and health; only the
	// operator sets front_door_url ('' for none), stored canonical
	// (frontdoor.Normalize). One active URL is one row (so one edge), and
	// an edge has at most one front door.
	`
CREATE TABLE gateways (
	edge_id        TEXT NOT NULL REFERENCES edges (id) ON DELETE CASCADE,
	service        TEXT NOT NULL,
	protocol       TEXT NOT NULL DEFAULT '',
	host           TEXT NOT NULL DEFAULT '',
	port           INTEGER NOT NULL DEFAULT 0,
	tls            INTEGER NOT NULL DEFAULT 0,
	mtls           INTEGER NOT NULL DEFAULT 0,
	region         TEXT NOT NULL DEFAULT '',
	zone           TEXT NOT NULL DEFAULT '',
	locality       TEXT NOT NULL DEFAULT '',
	priority       INTEGER NOT NULL DEFAULT 0,
	cost_tier      INTEGER NOT NULL DEFAULT 0,
	weight         INTEGER NOT NULL DEFAULT 0,
	rtt_us         {{bigint}} NOT NULL DEFAULT 0,
	healthy        INTEGER NOT NULL DEFAULT 0,
	last_seen      {{bigint}} NOT NULL DEFAULT 0,
	front_door_url TEXT NOT NULL DEFAULT '',
	front_door_at  {{bigint}} NOT NULL DEFAULT 0,
	PRIMARY KEY (edge_id, service)
);
CREATE UNIQUE INDEX gateways_front_door_url ON gateways (front_door_url) WHERE front_door_url <> '';
CREATE UNIQUE INDEX gateways_front_door_edge ON gateways (edge_id) WHERE front_door_url <> '';
`,
	// 10: the election's members query (Store.EgressGroups) reads an org's
	// enrolled edges seen within the live window from this index alone:
	// every column it reads is in it (cert_serial too, or SQLite reads the
	// row to check the partial index's own condition), so an edge's
	// status report, before the topology columns in its row, is never
	// read; and each edge's probe of the class from the second index
	// alone.
	`
CREATE INDEX edges_egress ON edges (org, last_seen, region, zone, priority, cost_tier, weight, id, cert_serial) WHERE cert_serial <> '';
CREATE INDEX edge_reach_probe ON edge_reach (edge_id, class, reachable, checked_at, destination);
`,
	// 11: publishes fan out in constant writes: one row per publish,
	// rollback or delete (its generation, the domain, the pools whose
	// edges it concerns), and per edge the generation its manifest is
	// built to; an edge's poll builds it past every newer fan-out.
	`
CREATE TABLE fanouts (
	gen        {{bigint}} PRIMARY KEY,
	domain     TEXT NOT NULL,
	pools      TEXT NOT NULL,
	created_at {{bigint}} NOT NULL
);
ALTER TABLE edges ADD COLUMN built {{bigint}} NOT NULL DEFAULT 0;
`,
	// 12: an ack's runtimes, the runtime each running cell of the edge ran
	// when it applied the sequence (manifest.Ack.Runtimes, JSON; '' for
	// none, as from agents before them).
	`
ALTER TABLE acks ADD COLUMN runtimes TEXT NOT NULL DEFAULT '';
`,
	// 13: HTTPS certificates (issue 35): each by name, its chain and what
	// may be shown of it; every key by its leaf's fingerprint, encrypted
	// under the certificate key-encryption key, so that a revision that
	// names an older certificate still gets its key; the certificate and
	// fingerprint each revision names; each edge's encryption public key;
	// each manifest entry's key sealed to it (JSON, '' for none).
	`
CREATE TABLE certificates (
	name        TEXT PRIMARY KEY,
	fingerprint TEXT NOT NULL,
	chain       TEXT NOT NULL,
	names       TEXT NOT NULL,
	issuer      TEXT NOT NULL,
	key_type    TEXT NOT NULL,
	not_before  {{bigint}} NOT NULL,
	not_after   {{bigint}} NOT NULL,
	created_at  {{bigint}} NOT NULL,
	updated_at  {{bigint}} NOT NULL
);
CREATE TABLE certificate_keys (
	fingerprint TEXT PRIMARY KEY,
	key_sealed  TEXT NOT NULL,
	created_at  {{bigint}} NOT NULL
);
ALTER TABLE domain_revisions ADD COLUMN certificate TEXT NOT NULL DEFAULT '';
ALTER TABLE domain_revisions ADD COLUMN fingerprint TEXT NOT NULL DEFAULT '';
CREATE INDEX domain_revisions_certificate ON domain_revisions (certificate) WHERE certificate <> '';
ALTER TABLE edges ADD COLUMN enc_key TEXT NOT NULL DEFAULT '';
ALTER TABLE manifest_entries ADD COLUMN sealed_key TEXT NOT NULL DEFAULT '';
`,
}
