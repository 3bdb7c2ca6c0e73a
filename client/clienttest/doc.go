// Package clienttest runs an in-process dsec API server for tests of the
// SDK, the CLI and other callers that must not need root or a real node.
//
// Service is an in-memory api.Service: each sandbox is a directory on the
// host (its "root"), execs are real host processes started in that
// directory, and files are real files under it. It is a test double for the
// control plane, not a sandbox: nothing is isolated. Node figures are
// synthetic and deterministic (MemAvailable drops by MemPerSandbox for each
// live sandbox) so callers can assert on what they compute from them.
//
// NewServer puts a Service behind the real HTTP face (api.NewHandler), so
// SDK, CLI and Python tests exercise exactly the wire format, validation
// and auth the real server has; only the control plane underneath is fake.
package clienttest
