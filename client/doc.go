// Package client is the Go SDK for dsec's native HTTP API (see the route
// contract in the api package). It is what the dsec CLI calls, and what Go
// programs driving RL rollouts should import.
//
// A Client talks to one dsec server over a unix socket
// (unix:///run/dsec/dsec.sock, where the server treats the caller as admin)
// or over TCP (tcp://host:port, http://..., https://...) with a bearer
// token. New reads DSEC_ADDR and DSEC_TOKEN when the address or token is
// not given.
//
// Wire types are the server's own structs, re-exported here as aliases so
// the JSON shape cannot drift between server and SDK. Errors from the server
// come back as *Error, which unwraps to the matching errdefs class, so
// callers test them with errors.Is(err, errdefs.ErrNotFound) or the
// IsNotFound-style helpers of this package, never by message.
//
// Exec streams: the request body carries one JSON line and then stdin, and
// the reply is NDJSON frames flushed as the process writes, so a long
// command's output arrives while it runs and stdin can be fed interactively
// (full duplex over HTTP/1.1).
package client
