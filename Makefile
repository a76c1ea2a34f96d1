# The README's two commands: `go run .` and `make test`.
GO ?= go

.PHONY: build test lint generate fmt

build:
	$(GO) build -o bin/gateway .

generate:
	@echo "nothing to generate yet"

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

test: lint
	$(GO) test -race -count=1 -timeout 20m ./...
