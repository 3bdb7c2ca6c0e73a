// Package testenv runs the real dsec binary for black-box suites (test/e2e,
// test/misconduct): it builds cmd/dsec once, starts `dsec serve` in a fresh
// directory (a unix socket, optionally a TCP listener), and drives it with
// the CLI and the Go SDK.
//
// A Server can live for one test (Start, cleaned up with t.Cleanup) or for a
// whole package (New in TestMain, then Close), which keeps suites that need
// many sandboxes fast. Close deletes every sandbox, stops the server and its
// layer daemon and reports anything left mounted below the directory.
package testenv
