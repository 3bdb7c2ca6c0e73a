package node

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Defaults of ExecRetention.
const (
	DefaultMaxEndedExecs  = 1000
	DefaultExecOutputKept = 64 << 20
)

// ExecRetention bounds what a sandbox keeps of its ended execs (records,
// results, kept output). A rollout's sandbox runs exec after exec for
// hours; without a bound each one would hold server memory and node disk
// (up to twice the output cap) until the sandbox is deleted.
type ExecRetention struct {
	// MaxEnded is how many ended execs a sandbox keeps, the oldest
	// forgotten first. 0 means DefaultMaxEndedExecs.
	MaxEnded int
	// MaxOutputBytes bounds the output kept of a sandbox's ended execs
	// together; the oldest are forgotten first, the newest is always kept.
	// 0 means DefaultExecOutputKept.
	MaxOutputBytes int64
}

func (r *ExecRetention) setDefaults() error {
	if r.MaxEnded < 0 || r.MaxOutputBytes < 0 {
		return fmt.Errorf("node: exec retention %d execs, %d bytes: must not be negative: %w",
			r.MaxEnded, r.MaxOutputBytes, errdefs.ErrInvalidArgument)
	}
	if r.MaxEnded == 0 {
		r.MaxEnded = DefaultMaxEndedExecs
	}
	if r.MaxOutputBytes == 0 {
		r.MaxOutputBytes = DefaultExecOutputKept
	}
	return nil
}

// execHistory is a sandbox's ended execs, oldest first.
type execHistory struct {
	// mu serialises retire; it is held while the history is read from
	// disk, which sb.mu must not be (every call on the sandbox takes it).
	mu     sync.Mutex
	loaded bool
	ended  []endedExec
	bytes  int64 // kept output of ended
	legacy bool  // node records of servers before 2026-11-30 exist
}

type endedExec struct {
	id    string
	bytes int64
}

// retire adds an ended exec to its sandbox's history and forgets the
// oldest ones beyond the retention bounds. It runs once the exec's waiters
// have been released.
func (l *Local) retire(sb *sandbox, sandboxID, execID string, outputBytes int64) {
	h := &sb.history
	h.mu.Lock()
	if !h.loaded {
		h.ended, h.bytes, h.legacy = l.loadEnded(sb, sandboxID)
		h.loaded = true
	}
	h.ended = append(h.ended, endedExec{id: execID, bytes: outputBytes})
	h.bytes += outputBytes
	// From now on the exec is read from its record and the runtime's
	// result (loadExec): the server holds ~40 bytes per ended exec, not
	// its request and result.
	var forget []string
	sb.mu.Lock()
	delete(sb.execs, execID)
	sb.mu.Unlock()
	limit := l.cfg.Execs
	for len(h.ended) > 1 && (len(h.ended) > limit.MaxEnded || h.bytes > limit.MaxOutputBytes) {
		old := h.ended[0]
		h.ended = h.ended[1:]
		h.bytes -= old.bytes
		forget = append(forget, old.id)
	}
	legacy := h.legacy
	h.mu.Unlock()
	for _, id := range forget {
		if err := l.deps.Runtime.RemoveExec(sandboxID, id); err != nil && !errdefs.IsNotFound(err) {
			l.log.Warn("node: forget exec", "sandbox", sandboxID, "exec", id, "err", err)
		}
		if legacy {
			_ = os.Remove(filepath.Join(l.execDir(sandboxID), id+".json"))
		}
	}
}

// loadEnded reads the ended execs of earlier server processes from disk,
// oldest first. Execs of this process are left out: each retires itself
// when it ends. So are execs still running, which stay until the sandbox
// is deleted.
func (l *Local) loadEnded(sb *sandbox, sandboxID string) (ended []endedExec, bytes int64, legacy bool) {
	ids, err := l.execIDs(sandboxID)
	if err != nil {
		return nil, 0, false
	}
	_, err = os.Stat(l.execDir(sandboxID))
	legacy = err == nil
	sb.mu.Lock()
	ours := make(map[string]bool, len(sb.execs))
	for id := range sb.execs {
		ours[id] = true
	}
	sb.mu.Unlock()
	type dated struct {
		endedExec
		at time.Time
	}
	var found []dated
	for _, id := range ids {
		if ours[id] {
			continue
		}
		info, err := l.loadExec(sandboxID, id)
		switch {
		case err != nil:
			found = append(found, dated{endedExec: endedExec{id: id}}) // unreadable: the first to go
			continue
		case info.Running:
			continue
		}
		d := dated{endedExec: endedExec{id: id}, at: info.StartedAt}
		if info.Result != nil {
			d.bytes = info.Result.OutputBytes
		}
		found = append(found, d)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].at.Before(found[j].at) })
	ended = make([]endedExec, len(found))
	for i, d := range found {
		ended[i] = d.endedExec
		bytes += d.bytes
	}
	return ended, bytes, legacy
}
