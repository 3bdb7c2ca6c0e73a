#!/usr/bin/env bash
# The whole test suite (run as root: see README.md). Root tests must not
# skip here: DSEC_REQUIRE_ROOT=1 turns such a skip into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export DSEC_REQUIRE_ROOT=1
export GOFLAGS=-mod=mod
BIN=$PWD/bin/dsec
status=0

echo "== gofmt, go vet, staticcheck"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted"; exit 1; fi
go vet ./...
if ! command -v staticcheck >/dev/null 2>&1; then
  GOFLAGS= go install honnef.co/go/tools/cmd/staticcheck@v0.8.2
  export PATH="$(go env GOPATH)/bin:$PATH"
fi
staticcheck ./...

echo "== go test (unit, integration, end-to-end, misconduct)"
# Packages in parallel, then the end-to-end suites one at a time: they run
# real servers that change host-wide state (swap, nftables, many cgroups)
# and must not disturb each other.
go test -count=1 -timeout 10m -p 2 $(go list ./... | grep -v '/test/') || status=1
go test -count=1 -timeout 10m -p 1 ./test/... || status=1

echo "== python client against a real server"
work=$(mktemp -d /tmp/dsec-pytest.XXXXXX)
scripts/mkrootfs.sh "$work/rootfs" >/dev/null
export DSEC_ADDR="unix://$work/dsec.sock"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve --data-dir "$work/data" --listen "$DSEC_ADDR" --listen "tcp://127.0.0.1:$port" >"$work/serve.log" 2>&1 &
server=$!
stop_server() {
  "$BIN" sandbox ls --json 2>/dev/null | python3 -c 'import json,sys; [print(s["id"]) for s in json.load(sys.stdin)]' | xargs -r "$BIN" sandbox rm >/dev/null 2>&1 || true
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap stop_server EXIT
for _ in $(seq 100); do [ -S "$work/dsec.sock" ] && break; sleep 0.1; done
"$BIN" image import pytest:latest "$work/rootfs" --public >/dev/null
echo "-- over the unix socket (admin)"
DSEC_TEST_IMAGE=pytest:latest DSEC_REQUIRE_SERVER=1 python3 -m unittest discover -s python/tests 2>&1 | tail -n 4 || status=1
echo "-- over TCP with a tenant's token"
"$BIN" tenant create pytest >/dev/null
token=$("$BIN" token create --tenant pytest --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["secret"])')
DSEC_ADDR="tcp://127.0.0.1:$port" DSEC_TOKEN="$token" DSEC_TEST_IMAGE=pytest:latest DSEC_REQUIRE_SERVER=1 \
  python3 -m unittest discover -s python/tests -v 2>&1 | tail -n 40 || status=1
exit $status
