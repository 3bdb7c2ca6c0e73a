package api

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

// sandboxIndex is the control plane's in-memory summary of every sandbox
// record (tenant, resources, state, timers) plus the creates in flight.
// Quota checks and the timer pass read it instead of listing and decoding
// every record in the store, which with thousands of sandboxes cost more
// than the create itself.
//
// It mirrors the store: built from it when the control plane starts and
// updated inside every store transaction that writes a sandbox record
// (bbolt runs those one at a time, so the index sees writes in commit
// order). A transaction whose commit fails after it updated the index has
// that record re-read from the store (resync).
//
// A create's reservation lives only here: it is checked against the
// tenant's quota and counted at once, and the sandbox's record is written
// once, after the node made the sandbox. Nothing of a reservation is on
// disk, so a crash cannot leak one; a sandbox the node made before the
// crash but the store never recorded is adopted from the node at restart
// (Reconcile) and counted then, once.
type sandboxIndex struct {
	mu      sync.Mutex
	entries map[string]*indexEntry // by sandbox id
	usage   map[string]usage       // by tenant: what its entries hold
	// timed are the ids of entries with a lifetime deadline or an idle
	// TTL: the only ones the timer pass looks at.
	timed map[string]struct{}
}

// indexEntry is what the index keeps of one sandbox.
type indexEntry struct {
	tenant string
	state  string
	held   usage // this sandbox's share of its tenant's usage (Sandboxes 1)
	// creating holds the provisional record of a create in flight: it has
	// no record in the store yet.
	creating *sandboxRecord

	deadline     time.Time
	idleTTL      time.Duration
	lastActivity time.Time // as persisted in the record
}

func newSandboxIndex() *sandboxIndex {
	return &sandboxIndex{entries: map[string]*indexEntry{}, usage: map[string]usage{}, timed: map[string]struct{}{}}
}

func entryOf(rec *sandboxRecord) *indexEntry {
	sb := &rec.Sandbox
	return &indexEntry{
		tenant: sb.Spec.Tenant, state: sb.State,
		held:     usage{Sandboxes: 1, CPU: sb.Spec.CPU, MemoryBytes: sb.Spec.MemoryBytes, DiskBytes: sb.Spec.DiskBytes},
		deadline: rec.Deadline, idleTTL: sb.Spec.IdleTTL, lastActivity: sb.LastActivity,
	}
}

func (e *indexEntry) holds() bool { return e.creating != nil || holdsResources(e.state) }

// load replaces the index's content with the store's records.
func (x *sandboxIndex) load(ctx context.Context, r store.Reader) error {
	fresh := newSandboxIndex()
	err := r.List(ctx, store.BucketSandboxes, "", func(key string, v []byte) error {
		var rec sandboxRecord
		if err := jsonUnmarshal(v, &rec); err != nil {
			return fmt.Errorf("sandbox record %s: %w", key, err)
		}
		fresh.setLocked(key, entryOf(&rec))
		return nil
	})
	if err != nil {
		return err
	}
	x.mu.Lock()
	x.entries, x.usage, x.timed = fresh.entries, fresh.usage, fresh.timed
	x.mu.Unlock()
	return nil
}

// setLocked replaces id's entry (nil removes it), moving its share of the
// tenant's usage. x.mu held.
func (x *sandboxIndex) setLocked(id string, e *indexEntry) {
	if old := x.entries[id]; old != nil {
		if old.holds() {
			x.addUsage(old.tenant, old.held, -1)
		}
		delete(x.entries, id)
		delete(x.timed, id)
	}
	if e == nil {
		return
	}
	x.entries[id] = e
	if e.holds() {
		x.addUsage(e.tenant, e.held, 1)
	}
	if !e.deadline.IsZero() || e.idleTTL > 0 {
		x.timed[id] = struct{}{}
	}
}

func (x *sandboxIndex) addUsage(tenant string, h usage, sign int) {
	u := x.usage[tenant]
	u.Sandboxes += sign * h.Sandboxes
	u.CPU += float64(sign) * h.CPU
	u.MemoryBytes += int64(sign) * h.MemoryBytes
	u.DiskBytes += int64(sign) * h.DiskBytes
	if u.Sandboxes == 0 {
		delete(x.usage, tenant) // also drops float residue of the CPU sum
		return
	}
	x.usage[tenant] = u
}

// put records a written record.
func (x *sandboxIndex) put(rec *sandboxRecord) {
	x.mu.Lock()
	x.setLocked(rec.Sandbox.ID, entryOf(rec))
	x.mu.Unlock()
}

// remove forgets a deleted record or releases a create's reservation.
func (x *sandboxIndex) remove(id string) {
	x.mu.Lock()
	x.setLocked(id, nil)
	x.mu.Unlock()
}

// resync re-reads one record after a transaction that touched it failed,
// so the index does not keep a write that never landed.
func (x *sandboxIndex) resync(ctx context.Context, r store.Reader, id string) {
	var rec sandboxRecord
	err := r.Get(context.WithoutCancel(ctx), store.BucketSandboxes, id, &rec)
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.entries[id]; e != nil && e.creating != nil {
		return // a create in flight owns the entry
	}
	switch {
	case err == nil:
		x.setLocked(id, entryOf(&rec))
	case errdefs.IsNotFound(err):
		x.setLocked(id, nil)
	}
}

// reserve counts a create in flight against its tenant: check sees the
// tenant's usage including every other reservation and refuses with an
// error, or the sandbox is counted at once. An id already known (recorded
// or being created) is refused.
func (x *sandboxIndex) reserve(rec *sandboxRecord, check func(usage) error) error {
	id := rec.Sandbox.ID
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.entries[id] != nil {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if err := check(x.usage[rec.Sandbox.Spec.Tenant]); err != nil {
		return err
	}
	x.setLocked(id, creatingEntry(rec))
	return nil
}

// putCreating makes id's entry a reservation again, after the write of its
// record failed.
func (x *sandboxIndex) putCreating(rec *sandboxRecord) {
	x.mu.Lock()
	x.setLocked(rec.Sandbox.ID, creatingEntry(rec))
	x.mu.Unlock()
}

func creatingEntry(rec *sandboxRecord) *indexEntry {
	provisional := *rec
	provisional.Sandbox.State = node.StateCreating
	e := entryOf(&provisional)
	e.creating = &provisional
	return e
}

// creating returns the provisional record of a create in flight.
func (x *sandboxIndex) creating(id string) (*sandboxRecord, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if e := x.entries[id]; e != nil && e.creating != nil {
		rec := *e.creating
		return &rec, true
	}
	return nil, false
}

// allCreating lists the provisional records of the creates in flight.
func (x *sandboxIndex) allCreating() []sandboxRecord {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []sandboxRecord
	for _, e := range x.entries {
		if e.creating != nil {
			out = append(out, *e.creating)
		}
	}
	return out
}

// tenantUsage is what tenant holds, creates in flight included.
func (x *sandboxIndex) tenantUsage(tenant string) usage {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.usage[tenant]
}

// sandboxesOf counts tenant's sandboxes in any state, creates in flight
// included.
func (x *sandboxIndex) sandboxesOf(tenant string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, e := range x.entries {
		if e.tenant == tenant {
			n++
		}
	}
	return n
}

// due lists the sandboxes whose timers may have fired at now: running or
// paused past their deadline, or running and idle for their idle TTL by
// the later of the persisted and the in-memory activity (activity). The
// caller re-checks each against its record.
func (x *sandboxIndex) due(now time.Time, activity func(id string) time.Time) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for id := range x.timed {
		e := x.entries[id]
		if e.state != node.StateRunning && e.state != node.StatePaused {
			continue
		}
		if !e.deadline.IsZero() && !now.Before(e.deadline) {
			out = append(out, id)
			continue
		}
		if e.state != node.StateRunning || e.idleTTL <= 0 {
			continue
		}
		last := e.lastActivity
		if t := activity(id); t.After(last) {
			last = t
		}
		if now.Sub(last) >= e.idleTTL {
			out = append(out, id)
		}
	}
	return out
}
