// Package e2b serves the parts of E2B's public API that the unmodified E2B
// SDKs use for the core workflow, over api.Service: the same callers,
// quotas, placement and audit as the native API. docs/e2b.md lists every
// difference from E2B's semantics.
//
// One origin for everything. E2B addresses each sandbox's envd under its own
// host name; with E2B_SANDBOX_URL set, the SDK sends all data-plane calls
// to one URL with an E2b-Sandbox-Id header instead. NewHandler routes on
// that header: with it, a request goes to the envd data plane of that
// sandbox (Connect RPCs process.Process and filesystem.Filesystem, GET/POST
// /files, /health); without it, to the REST control plane (/sandboxes,
// /v2/sandboxes, ...). E2B_API_URL and E2B_SANDBOX_URL can so name the same
// listener.
//
// Auth. REST calls carry an API key (X-API-KEY, e2b_<hex>), which is a dsec
// token: api.Service.Authenticate maps it to its tenant. Each sandbox made
// here gets a random envd access token, kept as a label of the sandbox
// (so it survives a restart of the server, and connect can return it); the
// data plane requires it as X-Access-Token and then acts as the sandbox's
// tenant. The (sandbox -> tenant, token) facts are cached in memory: they
// never change. Sandboxes made by the native API have no token and no
// data-plane access through this face.
//
// Processes. Process.Start maps to Service.StartExec; stdout and stderr
// become data events as they are written, and a watcher goroutine, not the
// request, waits for the end, so a process outlives its stream as in envd.
// Output fans out to the Start stream and to Connect streams (a slow
// stream holds the process's output back, a gone one does not); stdin is
// an io.Pipe that SendInput, StreamInput and CloseStdin reach. A pid is the
// exec's pid as the node reports it; List, SendSignal and Connect resolve
// pids and tags through Service.ListExecs, so they also see execs started
// elsewhere (without output or stdin for those).
//
// The protocol types are generated from .proto files under proto/, written
// from E2B's public spec; the generated code is committed.
package e2b
