package e2b

import (
	"io"
	"sync"

	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/process"
)

// subBuffer is how many output events a slow stream may lag behind before
// the process's output blocks (backpressure, bounded memory).
const subBuffer = 64

// proc is a process started through this face: its output fans out to the
// Start stream and to any Connect streams, and its stdin is a pipe that
// SendInput writes to. Processes started elsewhere (the native API, an
// earlier server) have no proc: they can be listed, signalled and waited
// for, but not attached to.
type proc struct {
	sandboxID string
	execID    string
	pid       uint32
	tag       string

	inMu  sync.Mutex // orders writes to stdin (not its close)
	stdin *io.PipeWriter

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	done chan struct{} // closed after end is set
	end  *pb.ProcessEvent_EndEvent
}

// subscriber is one stream reading a proc's output.
type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{}
	once sync.Once
}

func newProc(sandboxID, tag string, stdin *io.PipeWriter) *proc {
	return &proc{sandboxID: sandboxID, tag: tag, stdin: stdin, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
}

// subscribe adds a stream; it returns nil once the process has ended.
func (p *proc) subscribe() *subscriber {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil
	}
	s := &subscriber{ch: make(chan *pb.ProcessEvent, subBuffer), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	s.once.Do(func() { close(s.gone) })
}

// publish hands an event to every subscriber, waiting for slow ones (the
// process's output pump waits with it) but not for ones that went away.
func (p *proc) publish(ev *pb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *proc) finish(end *pb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	p.end = end
	p.mu.Unlock()
	close(p.done)
	p.closeStdin()
}

// closeStdin needs no lock: closing an io.Pipe is safe at any time, and it
// also releases a SendInput blocked on a process that does not read.
func (p *proc) closeStdin() {
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
}

// outputWriter turns one output stream of a process into data events.
type outputWriter struct {
	p      *proc
	stderr bool
}

func (w *outputWriter) Write(b []byte) (int, error) {
	data := append([]byte(nil), b...) // the caller reuses b
	ev := &pb.ProcessEvent_DataEvent{}
	if w.stderr {
		ev.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: data}
	} else {
		ev.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: data}
	}
	w.p.publish(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: ev}})
	return len(b), nil
}

type procKey struct {
	sandboxID string
	pid       uint32
}

// procTable indexes the running procs of this face by sandbox and pid.
type procTable struct {
	mu sync.Mutex
	m  map[procKey]*proc
}

func (t *procTable) init() { t.m = map[procKey]*proc{} }

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	t.m[procKey{p.sandboxID, p.pid}] = p
	t.mu.Unlock()
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	if t.m[procKey{p.sandboxID, p.pid}] == p {
		delete(t.m, procKey{p.sandboxID, p.pid})
	}
	t.mu.Unlock()
}

// find looks a proc up by pid, or by tag when pid is 0.
func (t *procTable) find(sandboxID string, pid uint32, tag string) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pid != 0 {
		return t.m[procKey{sandboxID, pid}]
	}
	for k, p := range t.m {
		if k.sandboxID == sandboxID && tag != "" && p.tag == tag {
			return p
		}
	}
	return nil
}

// dropSandbox closes the stdin of a deleted sandbox's procs; their
// watchers end when the control plane reports the execs gone.
func (t *procTable) dropSandbox(sandboxID string) {
	t.mu.Lock()
	var ps []*proc
	for k, p := range t.m {
		if k.sandboxID == sandboxID {
			ps = append(ps, p)
		}
	}
	t.mu.Unlock()
	for _, p := range ps {
		p.closeStdin()
	}
}

func (t *procTable) closeAll() {
	t.mu.Lock()
	ps := make([]*proc, 0, len(t.m))
	for _, p := range t.m {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	for _, p := range ps {
		p.closeStdin()
	}
}
