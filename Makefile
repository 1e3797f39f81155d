# tidemark: the README's two commands are `make demo` and `make test`.
GO          ?= go
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: demo demo-citus test test-short test-matrix test-citus pg-install bench soak soak-resync chaos lint rules build fuzz fuzz-short

## PG=MAJOR: every target that starts PostgreSQL runs on that version (make test PG=17)
# Its server binaries come from .ci/pgbin: Debian's /usr/lib/postgresql/MAJOR
# when installed, otherwise installed by ../shared/pg/install.sh (PG_INSTALL
# names another installer). Without PG, the binaries found on the machine
# (TIDEMARK_PG_BIN, initdb on PATH, the newest /usr/lib/postgresql): Debian's
# PostgreSQL 15 in CI. test-citus needs Citus built for the version.
PG ?=
ifneq ($(PG),)
TIDEMARK_PG_BIN := $(shell .ci/pgbin $(PG))
ifeq ($(TIDEMARK_PG_BIN),)
$(error PG=$(PG): no server binaries for PostgreSQL $(PG) (.ci/pgbin said why, above))
endif
export TIDEMARK_PG_BIN
endif

## demo: embedded Kafka + throwaway PostgreSQL + the service, end to end
# Builds bin/tidemark first, saying so: a first build downloads the modules
# and compiles, silent for a minute or more.
demo:
	@echo "building bin/tidemark (the first build downloads the Go modules and compiles: about a minute on 2 cores, more on a slow network; later builds take seconds)..."
	$(GO) build -o bin/tidemark ./cmd/tidemark
	./bin/tidemark demo

## demo-citus: the same demo with the warehouse on a Citus cluster (needs Citus installed; see docs/citus.md)
demo-citus:
	$(GO) build -o bin/tidemark ./cmd/tidemark
	./bin/tidemark demo --citus

## test: every test, with the race detector, against real PostgreSQL and kfake
test:
	$(GO) test -race -timeout 20m ./...

## test-short: the same tests on smaller workloads
test-short:
	$(GO) test -short -timeout 10m ./...

## test-matrix: the suites whose behaviour depends on the server, on PostgreSQL 14, 16, 17 and 18
# The supported-versions table of docs/design.md names these versions (a
# test checks it). Citus is tested on the default version only (test-citus):
# the matrix does not require it. .ci/matrix runs MATRIX_JOBS versions at a
# time; CI runs MATRIX_FLAGS=-short MATRIX_JOBS=2 (smaller workloads,
# no race detector); .ci/run says why.
PG_VERSIONS     ?= 14 16 17 18
MATRIX_PACKAGES ?= ./cdc/ ./mirror/ ./ingest/poll/ ./ingest/kafka/ ./raw/ ./reconcile/ ./aggregate/ ./migrate/ ./grants/ ./retention/ ./backfill/ ./lateness/ ./service/ ./internal/copytext/ ./internal/pgjson/ ./internal/pgerr/ ./internal/pgconnect/
MATRIX_FLAGS    ?= -race
MATRIX_JOBS     ?= 1
test-matrix:
	GO="$(GO)" MATRIX_PACKAGES="$(MATRIX_PACKAGES)" MATRIX_FLAGS="$(MATRIX_FLAGS)" MATRIX_JOBS="$(MATRIX_JOBS)" .ci/matrix $(PG_VERSIONS)

## pg-install: the server binaries of every PG_VERSIONS version, installed if missing (.ci/pgbin)
pg-install:
	@set -e; for v in $(PG_VERSIONS); do .ci/pgbin $$v; done

## test-citus: the suites that run on a Citus cluster the tests start (see docs/citus.md)
# Needs Citus installed for the PostgreSQL server binaries; without it the
# run fails instead of skipping.
# CI runs it with CITUS_FLAGS=-short: smaller workloads, and without the
# tests of what a Citus warehouse does not change (a source's replication
# session and slots, Kafka formats and registries: pgtest.CitusIndependent
# and pgtest.ServerIndependent).
CITUS_PACKAGES ?= ./ingest/kafka/ ./reconcile/ ./cdc/ ./retention/ ./backfill/ ./raw/ ./aggregate/ ./internal/pgerr/
CITUS_FLAGS    ?=
# Of the poll suite, three tests run there (a poll source's tables stay on
# the coordinator). The cluster fault tests (TestCitusFaults,
# TestCitusCDCFaults) and the demo on Citus start clusters of their own;
# keys --dry-run and mirror placement run on the shared cluster.
test-citus:
	TIDEMARK_TEST_CITUS=1 TIDEMARK_REQUIRE_CITUS=1 $(GO) test -count=1 -timeout 25m $(CITUS_FLAGS) $(CITUS_PACKAGES)
	TIDEMARK_TEST_CITUS=1 TIDEMARK_REQUIRE_CITUS=1 $(GO) test -count=1 -timeout 10m $(CITUS_FLAGS) -run '^TestPoll(LessonCustomers|SoftDelete|OverlappingRuns)$$' ./ingest/poll/
	TIDEMARK_TEST_CITUS=1 TIDEMARK_REQUIRE_CITUS=1 $(GO) test -count=1 -timeout 15m $(CITUS_FLAGS) -run '^TestCitus|^TestKeysDebezium$$|^TestDistributeOnCitus$$' ./cmd/tidemark/ ./cmd/tidemark/demo/ ./mirror/

## fuzz: each fuzz target for FUZZTIME (go test -fuzz takes one target a run)
# FUZZMINIMIZETIME bounds the minimization of each new interesting input: with
# go's default, 60s, FuzzParse spent most of a run minimizing large inputs.
FUZZTIME         ?= 1m
FUZZMINIMIZETIME ?= 5s
FUZZ_TARGETS     ?= config:FuzzParse internal/pgjson:FuzzScan cdc:FuzzDecode internal/copytext:FuzzCopyRows aggregate:FuzzCalendar grants:FuzzScript ingest/decode:FuzzAvro ingest/decode:FuzzProtobuf ingest/decode:FuzzJSONSchema ingest/decode:FuzzDebeziumRecentSchema ingest/decode:FuzzJSONSplit ingest/kafka:FuzzStoredOnce
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} in ./$${t%%:*} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) ./$${t%%:*}/; \
	done

## fuzz-short: 10,000 inputs of every fuzz target, 2,000 of those in FUZZ_SLOW (CI; FuzzCopyRows and FuzzStoredOnce run against a throwaway PostgreSQL)
# A count, not a duration: Go 1.26's fuzzing coordinator can report its own
# -fuzztime deadline as a failure ("context deadline exceeded", no failing
# input) on a loaded machine (golang/go#75804, fixed in Go 1.27).
# FuzzStoredOnce writes each input's batches to PostgreSQL, about 60
# inputs a second on 2 cores: 10,000 took most of the run.
FUZZ_SLOW ?= ingest/kafka:FuzzStoredOnce
fuzz-short:
	$(MAKE) fuzz FUZZTIME=10000x FUZZ_TARGETS="$(filter-out $(FUZZ_SLOW),$(FUZZ_TARGETS))"
	$(MAKE) fuzz FUZZTIME=2000x FUZZ_TARGETS="$(filter $(FUZZ_SLOW),$(FUZZ_TARGETS))"

## bench: throughput benchmarks with their in-run baselines (see docs/benchmarks.md)
# The scaling curves are written to docs/benchmarks/ as JSON and SVG.
# TIDEMARK_BENCH_QUICK=1 make bench runs every benchmark but BenchmarkPoll on
# fewer rows and writes the curves to $TMPDIR/tidemark-bench-quick instead;
# TIDEMARK_BENCH_RESULTS names another directory.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 1x -timeout 90m ./bench/

## soak: 180 simulated days of the service with kills and short retention (a few minutes; make test runs a 120-day one)
soak:
	TIDEMARK_SOAK=full $(GO) test -run '^TestSoak$$' -v -timeout 60m ./cmd/tidemark/

## soak-resync: a 1,000,000-row table resynced under a steady workload, the reader killed half-way, while another table's lag is measured (a few minutes; make test runs a 20,000-row one)
# TIDEMARK_RESYNC_SOAK_CHUNK_ROWS sets cdc.snapshot_chunk_rows (default: a
# tenth of the rows), TIDEMARK_RESYNC_SOAK_RATE the workload's transactions
# a second (200).
RESYNC_SOAK_ROWS ?= 1000000
soak-resync:
	TIDEMARK_RESYNC_SOAK_ROWS=$(RESYNC_SOAK_ROWS) $(GO) test -count=1 -run '^TestResyncSoak$$' -v -timeout 60m ./cdc/

## chaos: 15 minutes of kills, PostgreSQL restarts, network faults and a second instance under traffic (make test runs a bounded one); TIDEMARK_CHAOS_SEED replays a run
chaos:
	TIDEMARK_CHAOS=full $(GO) test -run '^TestChaos$$' -v -timeout 60m ./cmd/tidemark/

## lint: formatting, vet, staticcheck, and the alerting rules (with promtool, when installed)
lint: rules
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

## rules: check deploy/prometheus/alerts.yaml and run its unit tests
rules:
	@if command -v promtool >/dev/null 2>&1; then \
		promtool check rules deploy/prometheus/alerts.yaml && \
		promtool test rules deploy/prometheus/alerts_test.yaml; \
	elif [ -n "$${TIDEMARK_REQUIRE_PROMTOOL:-}" ]; then \
		echo "promtool not found (TIDEMARK_REQUIRE_PROMTOOL is set)"; exit 1; \
	else \
		echo "promtool not found: alerting rules not checked"; \
	fi

## build: the tidemark binary in bin/
build:
	$(GO) build -o bin/tidemark ./cmd/tidemark
