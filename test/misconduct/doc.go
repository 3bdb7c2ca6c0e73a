// Package misconduct is the misconduct suite: every trick a reward-hacking
// agent was seen to try (issue 4) runs as a real program inside a real
// sandbox of the real dsec binary, and each test asserts that it is
// contained: the attack fails the way the defence says it must, and the
// server and a bystander sandbox keep working during and after it.
//
// One server serves the whole suite (TestMain), with a unix socket for the
// admin and a TCP listener for tenants. The in-sandbox tool (./attack) is a
// static Go program copied into each attacking sandbox with `dsec file put`.
//
// Run as root: go test -count=1 ./test/misconduct/... (docs/security.md
// maps each test to the defence it proves).
package misconduct
