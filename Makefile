# Run `make` for the list of targets.
SHELL := /bin/bash
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME ?= 200000x
FUZZLONG ?= 5m

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

demo: ## Serve a rate-limited HTTP app on 127.0.0.1:8080 and show 200s then 429s (DATABASE_URL, else a throwaway PostgreSQL).
	$(GO) run ./cmd/pgratelimit demo $(DEMOFLAGS)

test: lint ## Everything: vet, staticcheck, all tests with -race (integration in both modes), a short fuzz run.
	$(GO) test -race -count=1 ./...
	PGRATELIMIT_TEST_MODE=per-check $(GO) test -race -count=1 ./integration_test/
	$(GO) test -run '^$$' -fuzz FuzzRefillMath -fuzztime $(FUZZTIME) ./pgratelimit/
	$(GO) test -run '^$$' -fuzz FuzzValidate -fuzztime $(FUZZTIME) ./pgratelimit/

lint: ## gofmt, go vet and staticcheck.
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fuzz: ## Fuzz the refill math and the input validation for longer (FUZZLONG=5m each).
	$(GO) test -run '^$$' -fuzz FuzzRefillMath -fuzztime $(FUZZLONG) ./pgratelimit/
	$(GO) test -run '^$$' -fuzz FuzzValidate -fuzztime $(FUZZLONG) ./pgratelimit/

bench: ## Go benchmarks of AllowN on many keys and one hot key, both storages.
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 1 ./integration_test/

.PHONY: help demo test lint fuzz bench
