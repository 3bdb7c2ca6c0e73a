# dsec: see README.md. Everything here runs as root on Linux.
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)
BIN     := bin/dsec
# A static binary: each sandbox's init is this binary (a C constructor takes
# over before Go starts), and without the dynamic loader and libc's
# relocated pages its PSS drops from ~115 kB to ~78 kB, about 80-110 kB of
# host memory per idle sandbox in `dsec bench density` (docs/perf.md).
# osusergo,netgo keep user and DNS lookups in Go, which static glibc can't do.
BUILDFLAGS := -tags osusergo,netgo -ldflags '-extldflags -static'
export GOFLAGS := -mod=mod

.PHONY: all build deps demo test lint clean bench

all: build

build:
	$(GO) build $(BUILDFLAGS) -o $(BIN) ./cmd/dsec

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
