// Package store is the control plane's state store: JSON values under
// (bucket, key), read one at a time or listed in key order, and written
// either directly or inside one serialisable read-write transaction.
//
// The interface is deliberately narrow (Get, Put, Delete, List, Update) so
// that a replicated backend (etcd, with Update as a software transaction)
// can implement it without emulating anything richer. Every backend runs
// the shared conformance suite in store/storetest. The bbolt backend lives
// in store/bolt; the backend is chosen at the edge (cmd/dsec).
package store
