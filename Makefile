# dsec: see README.md. Everything here runs as root on Linux.
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)
BIN     := bin/dsec
export GOFLAGS := -mod=mod

.PHONY: all build deps demo test lint clean bench

all: build

build:
	$(GO) build -o $(BIN) ./cmd/dsec

# deps installs what the demo and the tests need on a fresh Debian machine.
deps:
	./scripts/install-deps.sh

demo: deps build
	./scripts/demo.sh

# test is the whole suite: Go unit, integration, end-to-end and misconduct
# tests (root tests must not skip: DSEC_REQUIRE_ROOT=1), the Python client
# against a real server, and the unmodified E2B SDK against a real server.
test: deps build
	./scripts/test.sh

lint:
	gofmt -l $$(git ls-files '*.go')
	$(GO) vet ./...

clean:
	rm -rf bin

# bench prints dsec's benchmarks beside the raw C reference (see docs/perf.md).
bench: build
	./scripts/bench.sh
