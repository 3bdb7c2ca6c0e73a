// Package scheduler holds placement policy as pure functions over measured
// inputs, so it is tested without a kernel and can run on a node or in the
// control plane alike.
//
// Admission is by measured use, not by requests: a sandbox is admitted
// while the sum of the node's sandboxes' p95 CPU rates plus the
// newcomer's expected use stays under cores x overcommit, and while the
// memory actually held plus the newcomer's expected memory plus a reserve
// fits in physical memory. Requests only set a newcomer's expected use
// until it has been measured. A refusal names the short resource
// (Check's error wraps errdefs.ErrResourceExhausted); Capacity says how many
// more of a shape fit, by each resource, and which runs out first.
package scheduler
