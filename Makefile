# The README's two commands: `go run .` and `make test`.
GO ?= go
NPM ?= npm

.PHONY: build test lint generate generate-check node-deps test-go test-e2e

build:
	$(GO) build -o bin/gateway .

# generate rewrites the committed generated files: templ components and the
# browser bundle.
generate: node-deps
	$(GO) tool templ generate
	$(NPM) run --silent build

node-deps:
	@if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then $(NPM) ci --no-audit --no-fund; fi

# generate-check fails when a committed generated file is stale.
generate-check: node-deps
	$(GO) tool templ generate -check
	@tmp=$$(mktemp -d); \
	$(NPM) run --silent build -- --outdir=$$tmp --log-level=warning; \
	for f in app.js app.css; do \
		cmp -s $$tmp/$$f static/dist/$$f || { echo "static/dist/$$f is stale: run make generate and commit it"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp

lint: node-deps
	@unformatted=$$(gofmt -l $$(find . -name '*.go' -not -path './node_modules/*')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(NPM) run --silent typecheck

test-go:
	$(GO) test -race -count=1 -timeout 20m ./...

test-e2e: node-deps
	$(NPM) run --silent e2e

test: lint generate-check test-go test-e2e
