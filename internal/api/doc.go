// Package api is dsec's control plane: the Service (auth, tenants, quotas,
// placement, audit, lifecycle timers) and its HTTP/JSON face. Other faces
// (the E2B-compatible API in api/e2b) wrap the same Service.
//
// ControlPlane implements Service over three narrow dependencies: a
// store.Store for state (sandboxes, tenants, token hashes, image ACLs,
// finished exec results), a NodeSet of node.Agents, and an ImageManager.
// It never touches the kernel; nodes do.
//
// Invariants worth knowing:
//
//   - Isolation: a tenant's view is its own sandboxes and its own or public
//     images. Anything else answers ErrNotFound, worded exactly like a
//     missing object, so ids cannot be probed.
//   - Quotas: CreateSandbox reserves (quota check + count) in the control
//     plane's in-memory index of sandbox records before it calls a node,
//     so concurrent creates cannot overshoot, and writes the sandbox's
//     record once, after the node made it: one store commit per create.
//     Any failure deletes what the node may have made and releases the
//     reservation. A reservation is never on disk: after a crash, a
//     sandbox the node made but the store did not record is adopted from
//     the node (Reconcile), counted once.
//   - The index (index.go) mirrors every sandbox record (tenant, resources,
//     state, timers) and is updated in the same store transaction as the
//     record, so quota checks and the timer pass never list the store.
//   - Timers: the max-lifetime deadline is persisted with the record; idle
//     time is tracked in memory on every exec and file call and persisted
//     at most every ActivityPersistEvery, so a busy sandbox does not cost
//     a disk write per call. A running exec counts as activity.
//   - Restart: Start reconciles the store with what nodes report; a
//     sandbox a node no longer has is marked dead with a reason, never
//     silently dropped, and its recorded exec results stay readable.
//   - Audit: every Service call appends one JSON line to DataDir/audit.log
//     (rotated by size), including calls made by timers ("system").
//
// The HTTP face (NewHandler) is documented route by route in docs/api.md.
// Exec and image import stream NDJSON in full duplex; file transfers
// stream both ways and are never held whole in memory.
package api
