// Package storetest is the conformance suite every store.Store backend
// runs: the same scenarios, so the control plane can rely on the same
// behaviour from bbolt on one node and etcd across many.
package storetest
