# The README's two commands: `go run .` and `make test`.
GO ?= go
NPM ?= npm

# Every build and test here uses at least the toolchain go.mod names
# (go1.26.10: go1.26.8's standard library has known vulnerabilities,
# which `make vulncheck` finds): a machine whose go.env says
# GOTOOLCHAIN=local would otherwise ignore that line. A newer local Go is
# used as it is.
export GOTOOLCHAIN ?= auto

# Pinned static analysers, run by `go run` so that their dependencies stay
# out of go.mod (and out of the binary's module graph).
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOVULNCHECK = golang.org/x/vuln/cmd/govulncheck@v1.9.0
# The Go vulnerability database as of this module version (the project's
# reports, published as a module; vuln.go.dev itself is not needed).
VULNDB_VERSION = v0.0.0-20261105234957-e22db6528018

.PHONY: build test lint staticcheck vulncheck test-unit generate generate-check node-deps browser test-go test-store-postgres test-e2e fuzz test-fuzz bench

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/gateway .

# generate rewrites the committed generated files: templ components and the
# browser bundle.
generate: node-deps
	$(GO) tool templ generate
	$(NPM) run --silent build

node-deps:
	@if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then $(NPM) ci --no-audit --no-fund; fi

# generate-check fails when a committed generated file is stale: the
# bundle byte for byte, and its brotli and gzip copies by what they decode
# to (static/compress.mjs says why not by their bytes).
generate-check: node-deps
	$(GO) tool templ generate -check
	@tmp=$$(mktemp -d); \
	$(NPM) run --silent build -- --outdir=$$tmp --log-level=warning; \
	for f in app.js app.css; do \
		cmp -s $$tmp/$$f static/dist/$$f || { echo "static/dist/$$f is stale: run make generate and commit it"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp
	@node static/compress.mjs --check static/dist

lint: node-deps
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './node_modules/*')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(NPM) run --silent typecheck
	@# No hand-written source file over 800 lines: split it by topic.
	@long=$$(git ls-files '*.go' '*.ts' '*.mjs' '*.css' ':!:*_templ.go' ':!:static/dist/*' | xargs -r wc -l | awk '$$2 != "total" && $$1 > 800'); \
	if [ -n "$$long" ]; then echo "over 800 lines (split by topic):"; echo "$$long"; exit 1; fi

# staticcheck: the default checks but S1016 (staticcheck.conf says why).
staticcheck:
	$(GO) run $(STATICCHECK) ./...

# vulncheck runs govulncheck offline against golang.org/x/vulndb at
# VULNDB_VERSION, indexed into bin/vulndb once per version: it reports
# the vulnerabilities known on that day that the code can reach, in the
# modules it uses and in the standard library of the toolchain that
# builds it. It fails when the index holds fewer than 4,000 entries (a
# database that lost its reports would find nothing).
vulncheck:
	@if [ "$$(cat bin/vulndb/.version 2>/dev/null)" != "$(VULNDB_VERSION)" ]; then \
		set -e; rm -rf bin/vulndb; $(GO) mod download golang.org/x/vulndb@$(VULNDB_VERSION); \
		src=$$($(GO) env GOMODCACHE)/golang.org/x/vulndb@$(VULNDB_VERSION)/data/osv; \
		echo "indexing the vulnerability database ($(VULNDB_VERSION)) into bin/vulndb"; \
		$(GO) run golang.org/x/vulndb/cmd/indexdb@$(VULNDB_VERSION) -vulns $$src -out bin/vulndb; \
		echo "$(VULNDB_VERSION)" > bin/vulndb/.version; \
	fi
	@n=$$(ls bin/vulndb/ID | wc -l); [ "$$n" -ge 4000 ] || { echo "bin/vulndb holds $$n reports, fewer than 4,000: delete bin/vulndb and run make vulncheck again"; exit 1; }
	$(GO) run $(GOVULNCHECK) -db file://$(CURDIR)/bin/vulndb ./...

# fuzz runs each fuzz target for FUZZTIME, one after the other. Plain
# `go test` already runs their seed corpora (testdata/fuzz/ and f.Add).
FUZZTIME ?= 10s
FUZZ_TARGETS = FuzzWSCommand:./gateway FuzzHTTPBody:./gateway FuzzResponseCreate:./gateway FuzzStreamParser:./model/openai

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		name=$${t%%:*}; pkg=$${t#*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $(FUZZ_FLAGS) $$pkg; \
	done

test-go: node-deps
	$(GO) test -race -count=1 -timeout 20m ./...

# test-store-postgres runs the whole store suite (and the email provider's)
# again on PostgreSQL, each test in a schema of its own. Without
# GATEWAY_TEST_POSTGRES_URL its tests skip, saying what to set (.ci/run
# sets it, and the scale-out tests of test-go read it and
# GATEWAY_TEST_NATS_URL too).
test-store-postgres:
	GATEWAY_TEST_STORE=postgres $(GO) test -race -count=1 -timeout 20m ./store/ ./tools/...

# browser installs Debian's Chromium for the browser tests when it is missing
# (never a downloaded browser build).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's chromium for the browser tests"; \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
		else \
			echo "the browser tests need Chromium: sudo apt-get install -y chromium"; exit 1; \
		fi; }

# test-unit runs the page's unit tests (static/test/: the reducer of
# static/src/state.ts) with node's test runner.
test-unit: node-deps
	$(NPM) run --silent unit

test-e2e: node-deps browser
	$(NPM) run --silent e2e

# test-fuzz runs each fuzz target briefly (CI's share; `make fuzz
# FUZZTIME=5m` for a long run). It counts executions instead of timing
# them: Go 1.26's fuzz coordinator can fail a timed run with a bare
# "context deadline exceeded" when its deadline races a worker
# (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline to race.
# Minimizing each new input is bounded by a count too: by default it may
# take up to a minute per input, during which the run shows 0 execs/s (a
# fresh cache on a loaded machine spent minutes there).
test-fuzz:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(CI_FUZZTIME) FUZZ_FLAGS=-fuzzminimizetime=$(CI_FUZZMINIMIZE)

CI_FUZZTIME ?= 15000x
CI_FUZZMINIMIZE ?= 1000x

test: lint staticcheck vulncheck generate-check test-unit test-go test-store-postgres test-fuzz test-e2e

# bench runs the load generator's standard scenarios (idle, fanout, cancel,
# storage, scale, long, and cluster when PostgreSQL and NATS are set)
# against the real binary and, for fan-out, the bare coder/websocket
# floor, in about two minutes; it prints every figure with its target (and
# its ratio to the floor) and writes the report to bin/bench.json. Figures never fail it: it fails only
# on protocol errors or a failed `gateway check`. See BENCHMARKS.md;
# BENCH_FLAGS passes flags (go run ./bench/cmd/loadgen -h).
BENCH_FLAGS ?=
bench:
	@mkdir -p bin
	$(GO) run ./bench/cmd/loadgen -json bin/bench.json $(BENCH_FLAGS)
