package api

import (
	"context"
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
	"github.com/dsec-dev/dsec/internal/store"
)

// execFlushDelay bounds how long a finished exec's result waits to be
// written to the store with others.
const execFlushDelay = 50 * time.Millisecond

// execResults batches the results of finished execs into one store commit
// (one fsync) per execFlushDelay instead of one per exec, which cost
// ~0.4 ms of CPU per exec beside the next one. Until a result is
// committed the node answers for it from the sandbox's own records, and
// the control plane's reads look here first.
type execResults struct {
	mu      sync.Mutex
	pending map[string]node.ExecInfo // by execKey
	armed   bool
	// kept counts the committed results of each sandbox that had one
	// since this process started, so that pruning to Config.ExecHistory
	// costs a count only on a sandbox's first commit.
	kept map[string]int
}

// recordExec queues info and makes sure a flush follows.
func (s *ControlPlane) recordExec(info node.ExecInfo) {
	r := &s.execs
	r.mu.Lock()
	if r.pending == nil {
		r.pending = map[string]node.ExecInfo{}
	}
	r.pending[execKey(info.SandboxID, info.ExecID)] = info
	arm := !r.armed
	r.armed = true
	r.mu.Unlock()
	if arm {
		time.AfterFunc(execFlushDelay, func() { s.flushExecs(context.Background()) })
	}
}

// pendingExec returns a result not committed yet.
func (s *ControlPlane) pendingExec(sandboxID, execID string) (node.ExecInfo, bool) {
	s.execs.mu.Lock()
	defer s.execs.mu.Unlock()
	info, ok := s.execs.pending[execKey(sandboxID, execID)]
	return info, ok
}

// pendingExecs returns the uncommitted results of a sandbox's execs.
func (s *ControlPlane) pendingExecs(sandboxID string) []node.ExecInfo {
	s.execs.mu.Lock()
	defer s.execs.mu.Unlock()
	var out []node.ExecInfo
	for _, info := range s.execs.pending {
		if info.SandboxID == sandboxID {
			out = append(out, info)
		}
	}
	return out
}

// flushExecs commits the queued results in one transaction. The batch
// stays readable (pendingExec) until its commit is done.
func (s *ControlPlane) flushExecs(ctx context.Context) {
	r := &s.execs
	r.mu.Lock()
	r.armed = false
	batch := make(map[string]node.ExecInfo, len(r.pending))
	counts := make(map[string]int, len(r.pending)) // records per sandbox, where known
	for k, v := range r.pending {
		batch[k] = v
		if n, ok := r.kept[v.SandboxID]; ok {
			counts[v.SandboxID] = n
		}
	}
	r.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := s.st.Update(ctx, func(tx store.Tx) error {
		for k, info := range batch {
			// Only whether they exist matters: raw, not decoded.
			var raw json.RawMessage
			// A sandbox deleted meanwhile took its exec records along.
			if err := tx.Get(ctx, store.BucketSandboxes, info.SandboxID, &raw); errdefs.IsNotFound(err) {
				continue
			} else if err != nil {
				return err
			}
			n, ok := counts[info.SandboxID]
			if !ok {
				var err error
				if n, err = countExecs(ctx, tx, info.SandboxID); err != nil {
					return err
				}
			}
			if err := tx.Get(ctx, store.BucketExecs, k, &raw); errdefs.IsNotFound(err) {
				n++
			} else if err != nil {
				return err
			}
			if err := tx.Put(ctx, store.BucketExecs, k, info); err != nil {
				return err
			}
			// Pruned in steps of an eighth of the history, so that the
			// records are read and sorted once per so many execs.
			if n > s.cfg.ExecHistory+max(1, s.cfg.ExecHistory/8) {
				var err error
				if n, err = pruneExecs(ctx, tx, info.SandboxID, s.cfg.ExecHistory); err != nil {
					return err
				}
			}
			counts[info.SandboxID] = n
		}
		return nil
	})
	if err != nil {
		s.log.Warn("recording exec results", "n", len(batch), "err", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		if r.kept == nil {
			r.kept = map[string]int{}
		}
		for id, n := range counts {
			r.kept[id] = n
		}
	}
	for k, v := range batch {
		// A newer result for the same exec stays queued.
		if cur, ok := r.pending[k]; ok && cur.Result == v.Result {
			delete(r.pending, k)
		}
	}
}

// forgetExecCount drops the count of a deleted sandbox.
func (s *ControlPlane) forgetExecCount(sandboxID string) {
	s.execs.mu.Lock()
	delete(s.execs.kept, sandboxID)
	s.execs.mu.Unlock()
}

func countExecs(ctx context.Context, tx store.Tx, sandboxID string) (int, error) {
	n := 0
	err := tx.List(ctx, store.BucketExecs, sandboxID+"/", func(string, []byte) error {
		n++
		return nil
	})
	return n, err
}

// pruneExecs deletes all but the keep newest (by start) exec records of a
// sandbox and returns how many are left.
func pruneExecs(ctx context.Context, tx store.Tx, sandboxID string, keep int) (int, error) {
	type dated struct {
		key string
		at  time.Time
	}
	var all []dated
	err := tx.List(ctx, store.BucketExecs, sandboxID+"/", func(k string, v []byte) error {
		var info struct {
			StartedAt time.Time `json:"started_at"`
		}
		_ = json.Unmarshal(v, &info) // unreadable: zero time, the first to go
		all = append(all, dated{k, info.StartedAt})
		return nil
	})
	if err != nil || len(all) <= keep {
		return len(all), err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	for _, d := range all[:len(all)-keep] {
		if err := tx.Delete(ctx, store.BucketExecs, d.key); err != nil {
			return 0, err
		}
	}
	return keep, nil
}
