package image

import (
	"sync"
	"time"
)

// Progress reports a long import or commit.
type Progress struct {
	Layer       int   // 1-based layer being imported
	Layers      int   // total layers
	Bytes       int64 // file content bytes processed so far (all layers)
	BytesPerSec int64
	Done        bool
}

// progressInterval throttles callbacks.
const progressInterval = 250 * time.Millisecond

type progressTracker struct {
	fn     func(Progress)
	mu     sync.Mutex
	p      Progress
	start  time.Time
	last   time.Time
	active bool
}

func newProgress(fn func(Progress), layers int) *progressTracker {
	now := time.Now()
	return &progressTracker{fn: fn, p: Progress{Layers: layers}, start: now, last: now, active: fn != nil}
}

func (t *progressTracker) layer(i int) {
	if !t.active {
		return
	}
	t.mu.Lock()
	t.p.Layer = i
	t.emitLocked(true)
	t.mu.Unlock()
}

func (t *progressTracker) add(n int64) {
	if !t.active {
		return
	}
	t.mu.Lock()
	t.p.Bytes += n
	t.emitLocked(false)
	t.mu.Unlock()
}

func (t *progressTracker) done() {
	if !t.active {
		return
	}
	t.mu.Lock()
	t.p.Done = true
	t.emitLocked(true)
	t.mu.Unlock()
}

func (t *progressTracker) emitLocked(force bool) {
	now := time.Now()
	if !force && now.Sub(t.last) < progressInterval {
		return
	}
	t.last = now
	if el := now.Sub(t.start).Seconds(); el > 0 {
		t.p.BytesPerSec = int64(float64(t.p.Bytes) / el)
	}
	t.fn(t.p)
}
