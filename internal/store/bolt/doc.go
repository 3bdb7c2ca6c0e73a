// Package bolt is the single-node store.Store backend on bbolt: one file
// under the data dir, one bbolt bucket per store bucket. bbolt allows one
// writer at a time, which is exactly the serialisability store.Update
// promises.
package bolt
