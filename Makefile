# cellvisor. Run `make` (or `make help`) to list the targets.
#
# The two commands a newcomer needs are `make demo` and `make test`: on a fresh
# Debian machine, as root or as a user with sudo, each installs what it needs
# first, and only that (demo-deps, test-deps; see DEB_PACKAGES).

.DEFAULT_GOAL := help
# bash with pipefail, so that `go test ... | tee` fails when the tests do.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
# Tools go into the first GOPATH entry's bin (GOBIN is set explicitly on install).
TOOLBIN := $(firstword $(subst :, ,$(shell $(GO) env GOPATH)))/bin
GOFMT := $(shell $(GO) env GOROOT)/bin/gofmt
STATICCHECK_VERSION := v0.8.2

VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
# -s -w drop the symbol table and DWARF (panics still print full stack
# traces), -trimpath the build machine's paths: the agent ships to every edge
# host, and this halves it.
LDFLAGS := -s -w -X cellvisor/agent.Version=$(VERSION)
BUILDFLAGS := -trimpath
# The agent starts its cells on cgroup v1 through a join helper built into its
# own binary (cgexec): on linux/amd64 it is linked with its entry point
# (cgexec.LDFlags; the cgexec tests check this line). Without it the agent
# uses the same helper as a /bin/sh script, about half a millisecond more CPU
# per cell start.
CGEXEC_LDFLAGS := $(if $(filter linux/amd64,$(shell $(GO) env GOOS)/$(shell $(GO) env GOARCH)),-E cellvisor/cgexec.entry)
# The shipped binaries are static (CGO_ENABLED=0): nothing of the build
# host's glibc for an edge host to match, user and DNS lookups in pure Go,
# and the agent starts without the dynamic loader and libc's own start
# (perf stat -r 100 cellvisor version: 3.5-4.0 ms of CPU against 5.1 ms).
# Only builds set it: `go test -race` needs cgo.
STATIC := CGO_ENABLED=0

# What each target needs from Debian; deps installs what is missing of
# DEB_PACKAGES (the other lists are installed through it by demo-deps,
# test-deps, bench-deps and vm-deps).
#
# The demo: nginx with its dynamic Lua module (the OpenResty stand-in) and
# cjson for the cells' Lua. Nothing else: its control API runs on SQLite
# (embedded), and the shipped binaries build without cgo.
DEMO_DEB_PACKAGES := nginx-core libnginx-mod-http-lua lua-cjson
# The tests, beside the demo's: PostgreSQL's server for the control API
# store's tests (the metapackage: it brings the release's server,
# postgresql-15 on Debian 12); gcc and libc6-dev, because `go test -race`
# needs cgo; systemd provides systemd-analyze for units-check; util-linux,
# setpriv for the cgroup handover test (an unprivileged agent); rpm for the
# package tests, which read the built .rpm with rpm -qp (and build nothing
# with it); chromium is the headless browser of the fleet page's test
# (chromedp); dbus provides dbus-daemon: the tests of the cells' systemd scope
# run a private bus with a fake systemd on it (internal/fakesystemd).
# prometheus ships promtool: make test checks the sample alert rules with it,
# and the Go tests run promtool check metrics on real scrapes of a running
# agent and of a running control API. Debian starts the Prometheus server the
# package also ships (on :9090); deps stops and disables it when it installs
# the package, since only promtool is wanted.
TEST_DEB_PACKAGES := $(DEMO_DEB_PACKAGES) postgresql gcc libc6-dev systemd util-linux rpm chromium dbus prometheus
# The benchmarks (make bench), beside the demo's: PostgreSQL's server for the
# store's benchmarks; daemontools, s6 and runit are the classic supervisors
# the whole-process benchmark measures the agent's cold start against.
BENCH_DEB_PACKAGES := $(DEMO_DEB_PACKAGES) postgresql daemontools s6 runit
# make deps alone installs what every target but the VM test needs.
DEB_PACKAGES := $(sort $(TEST_DEB_PACKAGES) $(BENCH_DEB_PACKAGES))
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# The control API store's tests also run against a real PostgreSQL: test,
# test-short and bench start a throwaway server on 127.0.0.1:$(TEST_PG_PORT) (or
# one of the 9 ports after it, when it is taken: another run may hold it) in a
# temporary directory in /tmp (scripts/testpg; as root it runs as the user
# postgres, which must reach the directory), pass its URL to the tests in
# CELLVISOR_TEST_POSTGRES, and stop it afterwards, whether the tests passed or
# not. A CELLVISOR_TEST_POSTGRES already set is used as it is (nothing is
# started). Without PostgreSQL's binaries the tests run, and those skip.
TEST_PG_PORT ?= 15432

# WITH_PG prefixes a recipe line (one shell, started with @): it ends with
# CELLVISOR_TEST_POSTGRES exported, or unset when there is no PostgreSQL, and
# with `set -x` so that the commands after it are shown.
WITH_PG = \
	if [ -n "$${CELLVISOR_TEST_POSTGRES:-}" ]; then \
	  echo "$@: PostgreSQL store tests use CELLVISOR_TEST_POSTGRES from the environment"; \
	  export CELLVISOR_TEST_POSTGRES; \
	else \
	  pgdir="$$(mktemp -d /tmp/cellvisor-pg.XXXXXX)"; \
	  trap 'set +x; rm -f "$$pgdir.err"; scripts/testpg stop "$$pgdir" || echo "$@: could not stop the test PostgreSQL in $$pgdir" >&2' EXIT; \
	  trap 'exit 130' INT; trap 'exit 143' TERM; \
	  pgrc=3; pgport=$(TEST_PG_PORT); \
	  while [ "$$pgrc" = 3 ] && [ "$$pgport" -lt $$(($(TEST_PG_PORT) + 10)) ]; do \
	    pgrc=0; pgurl="$$(scripts/testpg start "$$pgdir" "$$pgport" 2>"$$pgdir.err" | tail -n 1)" || pgrc=$$?; \
	    cat "$$pgdir.err" >&2; pgport=$$((pgport + 1)); \
	  done; \
	  if [ "$$pgrc" = 2 ]; then \
	    echo "$@: the PostgreSQL store tests will be skipped: $$(sed -n 's/^testpg: //p' "$$pgdir.err" | tail -n 1)"; \
	  elif [ "$$pgrc" != 0 ]; then \
	    echo "$@: could not start the test PostgreSQL (exit $$pgrc, see above): make $@ TEST_PG_PORT=... tries other ports," \
	      "CELLVISOR_TEST_POSTGRES=URL uses a server of yours" >&2; \
	    exit "$$pgrc"; \
	  else \
	    echo "$@: PostgreSQL store tests use a test server at $$pgurl"; \
	    export CELLVISOR_TEST_POSTGRES="$$pgurl"; \
	  fi; \
	fi; \
	set -x;

.PHONY: help deps demo-deps test-deps bench-deps tools build packages packages-test test test-short test-vm vm-deps lint units-check bench demo demo-check clean

help: ## show this list of targets
	@echo 'usage: make TARGET'
	@echo
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z0-9_-]+:.*## / { printf "  %-13s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

deps: ## install what is missing for every target but test-vm: Debian packages (DEB_PACKAGES: demo's, test's and bench's) and Go modules
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "deps: not a Debian host (no dpkg): install nginx with the Lua module (or OpenResty) yourself,"; \
	  echo "deps: and PostgreSQL or set CELLVISOR_TEST_POSTGRES to a server the tests may create databases on;"; \
	  echo "deps: tests that need them skip themselves and say so"; \
	else \
	  echo "deps: checking the Debian packages: $(DEB_PACKAGES)"; \
	  missing=""; \
	  for p in $(DEB_PACKAGES); do \
	    [ "$$(dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null)" = "install ok installed" ] || missing="$$missing $$p"; \
	  done; \
	  if [ -n "$$missing" ]; then \
	    echo "deps: installing$$missing (apt-get update, then install: a few minutes the first time)"; \
	    $(SUDO) apt-get update; \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	    case " $$missing " in *" prometheus "*) \
	      if [ -d /run/systemd/system ]; then $(SUDO) systemctl disable --now prometheus || true; fi;; \
	    esac; \
	  else \
	    echo "deps: Debian packages present: $(DEB_PACKAGES)"; \
	  fi; \
	fi
	@echo "deps: downloading the Go modules (go mod download: a minute or two the first time, nothing after)"
	$(GO) mod download
	@echo "deps: building the Go tools of go.mod (Pebble, the test ACME CA of controlapi/acmeissue's tests) into the build cache"
	$(GO) build -o /dev/null tool

demo-deps: ## install what is missing for the demo: nginx + Lua module, cjson, and the Go modules
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(DEMO_DEB_PACKAGES)"

test-deps: ## install what is missing for the tests: the demo's, PostgreSQL, gcc, systemd, rpm, chromium, dbus, promtool, and the Go modules
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(TEST_DEB_PACKAGES)"

bench-deps: ## install what is missing for the benchmarks: the demo's, PostgreSQL, daemontools, s6, runit, and the Go modules
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(BENCH_DEB_PACKAGES)"

tools: ## install staticcheck and benchstat into $(go env GOPATH)/bin if missing
	@if ! "$(TOOLBIN)/staticcheck" -version 2>/dev/null | grep -q '$(STATICCHECK_VERSION:v%=%)'; then \
	  echo "tools: installing staticcheck $(STATICCHECK_VERSION)"; \
	  GOBIN="$(TOOLBIN)" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); \
	fi
	@if [ ! -x "$(TOOLBIN)/benchstat" ]; then \
	  echo "tools: installing benchstat"; \
	  GOBIN="$(TOOLBIN)" $(GO) install golang.org/x/perf/cmd/benchstat@latest; \
	fi

build: ## build bin/cellvisor, bin/cellvisor-control and bin/cellvisor-demo (version from git describe, else "dev")
	@echo "build: compiling the agent, the control API and the demo into bin/ (the first build compiles every dependency: a minute or two)"
	$(STATIC) $(GO) build $(BUILDFLAGS) -ldflags "$(LDFLAGS) $(CGEXEC_LDFLAGS)" -o bin/cellvisor ./cmd/cellvisor
	$(STATIC) $(GO) build $(BUILDFLAGS) -ldflags "$(LDFLAGS)" -o bin/cellvisor-control ./cmd/cellvisor-control
	$(STATIC) $(GO) build $(BUILDFLAGS) -ldflags "$(LDFLAGS)" -o bin/cellvisor-demo ./cmd/cellvisor-demo

# The packages' version is git describe's, made valid for deb and rpm
# (packaging/version.go): X.Y.Z from the last tag vX.Y.Z, +gitN.gHASH past it;
# 0.0.0+gitN.gHASH with no tag, N counting every commit.
packages: build ## build the cellvisor and cellvisor-control .deb and .rpm packages into dist/ (nfpm, packaging/)
	@echo "packages: building the .deb and .rpm packages into dist/ from bin/ and packaging/"
	@mkdir -p dist
	rm -f dist/*.deb dist/*.rpm
	$(GO) run ./packaging/cmd/mkpkg --root . --bindir bin --out dist

# make test runs these too. As root on a Debian host, they install the .debs
# with dpkg, upgrade and purge them (the host is left as it was).
packages-test: test-deps ## build both formats, check them with dpkg-deb and rpm -qp, install, upgrade and purge the .debs (as root)
	$(GO) test -race -count=1 -timeout 10m -v ./packaging/...

# promtool is on PATH from here on (test-deps installed it; check rules fails
# without it), so the tests' promtool check metrics of a real agent scrape
# (cmd/cellvisor) and of a real control API scrape (controlapi) run.
test: test-deps ## run every test with -race, on a PostgreSQL started for the run; tests skip, saying why, where the host lacks root/cgroups/nginx/PostgreSQL
	promtool check rules docs/alerts/cellvisor.rules.yml
	@$(WITH_PG) $(GO) test -race -count=1 -timeout 30m ./...

# The tests that start real cells and time their restarts (the supervisor's,
# activation's and the end-to-end ones of cmd/cellvisor) once more, with two
# CPU burners running beside them: a busy machine must not turn the suite red
# (issue 33). The burners are this recipe's own children, stopped by their
# PIDs however it ends. -short leaves out the two soaks that `make test` has
# just run (100 agent kills, 40 MiB of cell logs: volume, not timing), which
# would double the time; LOAD_FLAGS= runs them too. CI runs it after
# `make test`. On 2 cores it took 8 minutes beside other test runs (load
# about 9), 13 beside a VM test as well; alone, expect about half.
LOAD_PACKAGES := ./supervisor/ ./activation/ ./cmd/cellvisor/
LOAD_FLAGS ?= -short

.PHONY: test-load
test-load: test-deps ## run the supervisor, activation and end-to-end tests again (-race -short) beside two CPU burners
	@burners=""; \
	trap 'kill $$burners 2>/dev/null || true; wait $$burners 2>/dev/null || true' EXIT; \
	trap 'exit 130' INT; trap 'exit 143' TERM; \
	for i in 1 2; do (while :; do :; done) & burners="$$burners $$!"; done; \
	echo "test-load: two CPU burners running (pids$$burners)"; \
	set -x; \
	$(GO) test -race -count=1 $(LOAD_FLAGS) -timeout 20m $(LOAD_PACKAGES)

# The VM test (scripts/vm/README.md): what it needs from Debian, beside test-deps'.
VM_DEB_PACKAGES := qemu-system-x86 qemu-utils debootstrap e2fsprogs

vm-deps: ## install what the VM test needs (qemu, qemu-utils, debootstrap, e2fsprogs)
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(VM_DEB_PACKAGES)"

# As root: builds the packages and a cached Debian bookworm image
# (debootstrap from this host's apt sources), boots it with qemu (KVM when it
# works, TCG otherwise), installs the .debs and runs the checks of
# scripts/vm/README.md, each printed PASS or FAIL. About 9-12 minutes under
# TCG on 2 cores, plus about 6.5 minutes the first time, for the image;
# VM_ARGS="--only a,b" runs a subset.
test-vm: test-deps vm-deps ## as root: install the packages on a Debian 12 VM with systemd and cgroup v2 (qemu) and check limits, restarts, upgrades, reboots, purge
	$(SUDO) scripts/vm/run $(VM_ARGS)

test-short: test-deps ## run the tests in -short mode (the quick ones), with a PostgreSQL as for test
	@$(WITH_PG) $(GO) test -race -short -count=1 -timeout 10m ./...

# The tidy check uses `go mod tidy -diff`: it changes nothing on disk (so there
# is nothing to restore), prints what tidy would change and fails if anything would.
lint: tools ## go vet, gofmt, staticcheck, and fail if go mod tidy would change go.mod/go.sum
	$(GO) vet ./...
	@unformatted="$$($(GOFMT) -l .)"; \
	if [ -n "$$unformatted" ]; then \
	  echo "gofmt: these files are not formatted (run gofmt -w on them):"; \
	  echo "$$unformatted"; \
	  exit 1; \
	fi
	"$(TOOLBIN)/staticcheck" ./...
	@$(GO) mod tidy -diff || { echo "go mod tidy would change go.mod/go.sum (diff above): run go mod tidy"; exit 1; }

# The units' exposure in `systemd-analyze security` may not rise above these
# (the threshold is on its 0-100 scale: 20 is "2.0"). verify runs on copies
# whose /usr/bin/ points at the binaries just built (it checks that each
# command exists), and any warning it prints (an unknown or misspelt key, a
# key this systemd lacks) fails the check.
UNITS := cellvisor cellvisor-control
THRESHOLD_cellvisor := 20
THRESHOLD_cellvisor-control := 15

units-check: ## systemd-analyze verify both units, and fail if their security exposure rises above 2.0 (agent) / 1.5 (control API)
	@command -v systemd-analyze >/dev/null 2>&1 || { echo "units-check: systemd-analyze is missing (make deps installs Debian's systemd package)"; exit 1; }
	@echo "units-check: $$(systemd-analyze --version | head -n 1)"
	@tmp="$$(mktemp -d)"; trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/bin"; \
	$(GO) build -o "$$tmp/bin/cellvisor" ./cmd/cellvisor; \
	$(GO) build -o "$$tmp/bin/cellvisor-control" ./cmd/cellvisor-control; \
	for u in $(UNITS); do sed "s#/usr/bin/#$$tmp/bin/#g" "systemd/$$u.service" >"$$tmp/$$u.service"; done; \
	cp systemd/cellvisor.slice "$$tmp/"; \
	out="$$(cd "$$tmp" && systemd-analyze verify --man=no $(UNITS:%=./%.service) ./cellvisor.slice 2>&1)" || { echo "$$out"; echo "units-check: systemd-analyze verify failed"; exit 1; }; \
	if [ -n "$$out" ]; then echo "$$out"; echo "units-check: systemd-analyze verify warned (above)"; exit 1; fi; \
	echo "units-check: systemd-analyze verify: both units and the slice clean"
	@rc=0; \
	check() { \
	  out="$$(systemd-analyze security --offline=yes --threshold="$$2" "systemd/$$1.service" 2>&1)" && r=0 || r=$$?; \
	  echo "units-check: $$1.service: $$(echo "$$out" | tail -n 1 | sed 's/^→ //') (threshold $$2)"; \
	  if [ "$$r" != 0 ]; then echo "$$out" | grep '✗'; echo "units-check: $$1.service exposure above $$2/100"; rc=1; fi; \
	}; \
	check cellvisor $(THRESHOLD_cellvisor); \
	check cellvisor-control $(THRESHOLD_cellvisor-control); \
	exit $$rc

# An activation of 20,000 artifacts takes about a second: fewer rounds. A
# control API poll takes about 50 µs: 20,000 of them (20 per simulated edge).
# The fleet load runs 10,000 edges in real time for 3 fleet minutes per store
# (after 1 of warm-up) against a cellvisor-control serve child it builds
# (CELLVISOR_FLEET_EDGES, CELLVISOR_FLEET_MINUTES and
# CELLVISOR_FLEET_STATUS_CHANGES change it; docs/control.md).
# PublishServed publishes 1,000 times to a cell of 1,000 domains, loaded and
# reloaded (about 20 s and 2 minutes); DataLoad loads 1,000 and 10,000.
# The egress failover (five holder kills with a 2 s lease across three real
# agents and the built control API) prints each round; the agents' debug logs
# of a failing round are filtered out.
bench: bench-deps ## run the benchmarks (PostgreSQL ones on a server started for the run) into bench/latest.txt; compare with bench/base.txt when there is one
	@mkdir -p bench
	@$(WITH_PG) \
	$(GO) test -run '^$$' -bench . -skip 'PublishServed|DataLoad|BenchmarkTLS' -benchtime 20x -count 5 ./supervisor/ | tee bench/latest.txt; \
	$(GO) test -run '^$$' -bench 'BenchmarkTLS/handshake' -benchtime 3000x -count 3 ./supervisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench 'BenchmarkTLS/(load|reload)' -benchtime 5x -count 1 ./supervisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench PublishServed -benchtime 1000x -count 1 -timeout 30m ./supervisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench DataLoad -benchtime 5x -count 3 ./supervisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench AgentRSS -benchtime 20x -count 5 ./cmd/cellvisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench WholeProcess8 -benchtime 5x -count 5 ./cmd/cellvisor/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench EgressFailover -benchtime 5x -count 1 ./cmd/cellvisor/ | grep -v '^ *{' | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench 'Activation(PerCell)?$$' -benchtime 3x -count 5 ./activation/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench SnapshotActivationRSS -benchtime 1x -count 1 ./activation/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench Poll -benchtime 20000x -count 5 ./controlapi/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench SnapshotDownloads16 -benchtime 1x -count 3 ./controlapi/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench FleetLoad -benchtime 1x -count 1 -timeout 60m -v ./controlapi/ | grep -v '^=== ' | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 -timeout 30m ./controlapi/store/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench 'Choose|Bare' -benchtime 1000000x -count 5 ./placement/ | tee -a bench/latest.txt; \
	$(GO) test -run '^$$' -bench MovedFraction -benchtime 1x -count 1 ./placement/ | tee -a bench/latest.txt
	@if [ -f bench/base.txt ] && [ -x "$(TOOLBIN)/benchstat" ]; then \
	  "$(TOOLBIN)/benchstat" bench/base.txt bench/latest.txt; \
	elif [ -f bench/base.txt ]; then \
	  echo "bench: benchstat is not installed (make tools) to compare with bench/base.txt"; \
	else \
	  echo "bench: no bench/base.txt to compare with (cp bench/latest.txt bench/base.txt makes one)"; \
	fi

demo: demo-deps build ## run the demo: a control API on SQLite, an enrolled agent with 8 slots, cell-01 serving a published domain (Ctrl-C stops)
	@echo "demo: starting ./bin/cellvisor-demo (Ctrl-C stops it and cleans up)"
	./bin/cellvisor-demo

demo-check: demo-deps build ## run the demo scenario non-interactively (drain, undrain, publish, restart, rate limit); fails unless every step worked
	@echo "demo-check: running ./bin/cellvisor-demo --check"
	./bin/cellvisor-demo --check

clean: ## remove bin/, dist/ and the demo's files (.demo/)
	rm -rf bin dist .demo
