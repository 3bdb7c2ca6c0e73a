package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/runtime/shim"
)

// Files of one exec under <Spec.Dir>/execs/<execID>/.
const (
	execsDir        = "execs"
	resultFile      = "result.json"
	pendingFile     = "result.json.tmp" // "running <shim pid> <start time>" while it runs
	StdoutLog       = "stdout"
	StderrLog       = "stderr"
	olderHalfSuffix = ".1"
)

var execIDRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func newExecID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validateProcess(p *Process) error {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return fmt.Errorf("no command: %w", errdefs.ErrInvalidArgument)
	}
	for _, s := range append(append(append([]string{}, p.Args...), p.Env...), p.Cwd, p.User) {
		if strings.ContainsRune(s, 0) {
			return fmt.Errorf("argument, env, cwd or user contains a NUL byte: %w", errdefs.ErrInvalidArgument)
		}
	}
	for _, e := range p.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("env entry %q is not KEY=VALUE: %w", e, errdefs.ErrInvalidArgument)
		}
	}
	if p.Cwd != "" && !strings.HasPrefix(p.Cwd, "/") {
		return fmt.Errorf("cwd %q is not absolute: %w", p.Cwd, errdefs.ErrInvalidArgument)
	}
	if bytes.ContainsAny(p.Record, "\n\x00") {
		return fmt.Errorf("exec record must be one line: %w", errdefs.ErrInvalidArgument)
	}
	if p.Timeout < 0 || p.OutputCap < 0 {
		return fmt.Errorf("negative timeout or output cap: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// mergeEnv overlays over on base (later wins) and makes sure PATH is set.
func mergeEnv(base, over []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(over)+1)
	for _, e := range append(append([]string{}, base...), over...) {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := idx[k]; ok {
			out[i] = e
			continue
		}
		idx[k] = len(out)
		out = append(out, e)
	}
	if _, ok := idx["PATH"]; !ok {
		out = append(out, DefaultPath)
	}
	return out
}

type nsExec struct {
	id      string
	dir     string
	pid     int // host pid of the process (its process group id too)
	shim    *proc
	stdin   *os.File
	copies  sync.WaitGroup
	done    chan struct{}
	res     *ExecResult
	err     error
	started time.Time
}

var _ Exec = (*nsExec)(nil)

func (e *nsExec) ID() string { return e.id }
func (e *nsExec) Pid() int   { return e.pid }

// Signal sends sig to the process's process group (it leads its own).
func (e *nsExec) Signal(sig syscall.Signal) error {
	select {
	case <-e.done:
		return fmt.Errorf("exec %s has ended: %w", e.id, errdefs.ErrFailedPrecondition)
	default:
	}
	if err := unix.Kill(-e.pid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("exec %s has ended: %w", e.id, errdefs.ErrFailedPrecondition)
		}
		return err
	}
	return nil
}

func (e *nsExec) Wait(ctx context.Context) (*ExecResult, error) {
	select {
	case <-e.done:
		return e.res, e.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Start starts p inside sandbox id through an exec shim.
func (r *NamespaceRuntime) Start(ctx context.Context, id string, p Process, pio IO) (_ Exec, err error) {
	if err := validateProcess(&p); err != nil {
		return nil, err
	}
	sb, err := r.get(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	paused, gone := sb.paused, sb.gone
	sb.mu.Unlock()
	if gone {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if paused {
		return nil, fmt.Errorf("sandbox %s is paused: %w", id, errdefs.ErrFailedPrecondition)
	}
	e := &nsExec{id: newExecID(), done: make(chan struct{})}
	e.dir = filepath.Join(sb.dir, execsDir, e.id)
	if err := os.MkdirAll(e.dir, 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(e.dir)
		}
	}()
	outCap := p.OutputCap
	if outCap == 0 {
		outCap = r.outputCap
	}
	var c shim.Config
	c.Add(shim.TExecID, e.id)
	c.Add(shim.TExecDir, e.dir)
	for _, a := range p.Args {
		c.Add(shim.TArg, a)
	}
	for _, v := range mergeEnv(sb.env, p.Env) {
		c.Add(shim.TEnv, v)
	}
	c.Add(shim.TCwd, p.Cwd)
	c.Add(shim.TUser, p.User)
	if p.Timeout > 0 {
		c.AddInt(shim.TTimeoutMS, max(1, p.Timeout.Milliseconds()))
	}
	c.AddInt(shim.TOutCap, outCap)
	if len(p.Record) > 0 {
		c.AddBytes(shim.TRecord, p.Record)
	}
	if p.Tty {
		// stdout and stderr are both the terminal; the output arrives on
		// Stdout.
		c.Add(shim.TTTYRoot, "/proc/"+strconv.Itoa(sb.init.pid)+"/root")
	}
	for _, path := range sb.group.Paths() {
		c.Add(shim.TCgroup, path)
	}
	c.Add(shim.TCaps, strconv.FormatUint(r.caps, 10))
	if len(sb.filter) > 0 {
		c.AddBytes(shim.TSeccomp, sb.filter)
	}

	// stdio of the shim: pipes we read (or /dev/null when nobody listens).
	null := int(r.null.Fd())
	stdio := []int{null, null, null}
	var closeAfter []int
	defer func() {
		for _, fd := range closeAfter {
			unix.Close(fd)
		}
	}()
	type outCopy struct {
		f *os.File
		w io.Writer
	}
	var copies []outCopy
	defer func() {
		if err != nil {
			for _, c := range copies {
				c.f.Close()
			}
		}
	}()
	for i, w := range []io.Writer{pio.Stdout, pio.Stderr} {
		if w == nil {
			continue
		}
		rd, wr, perr := pipe()
		if perr != nil {
			return nil, perr
		}
		_ = unix.SetNonblock(rd, true)
		copies = append(copies, outCopy{os.NewFile(uintptr(rd), "exec-out"), w})
		stdio[1+i] = wr
		closeAfter = append(closeAfter, wr)
	}
	if pio.Stdin != nil {
		rd, wr, perr := pipe()
		if perr != nil {
			return nil, perr
		}
		_ = unix.SetNonblock(wr, true)
		e.stdin = os.NewFile(uintptr(wr), "exec-stdin")
		stdio[0] = rd
		closeAfter = append(closeAfter, rd)
	}

	var st *started
	var status *os.File
	cerr := sb.init.control(func(pidfd int) {
		st, status, err = r.startShim(ctx, shim.ModeExec, c.Bytes(), 0, stdio, pidfd)
	})
	if cerr != nil {
		err = cerr
	}
	if err != nil {
		if e.stdin != nil {
			e.stdin.Close()
		}
		return nil, err
	}
	for _, fd := range closeAfter {
		unix.Close(fd)
	}
	closeAfter = nil
	e.shim = st.proc
	e.started = time.Now()
	v, err := readStatus(ctx, status)
	if err != nil {
		_ = st.proc.signal(unix.SIGKILL)
		_ = st.proc.wait(context.Background())
		st.proc.reap()
		_ = st.proc.close()
		if e.stdin != nil {
			e.stdin.Close()
		}
		return nil, fmt.Errorf("exec in %s: %w", id, err)
	}
	if e.pid, err = strconv.Atoi(v); err != nil {
		_ = st.proc.signal(unix.SIGKILL)
		return nil, fmt.Errorf("exec shim status %q: %w", v, err)
	}
	if e.stdin != nil {
		go func() {
			_, _ = io.Copy(e.stdin, pio.Stdin)
			e.stdin.Close()
		}()
	}
	// Output copies are registered before finish can wait for them.
	for _, c := range copies {
		e.copies.Add(1)
		go func() {
			defer e.copies.Done()
			defer c.f.Close()
			// Keep draining even if the caller's writer fails, so the shim
			// never blocks on a full pipe.
			if _, cerr := io.Copy(c.w, c.f); cerr != nil {
				_, _ = io.Copy(io.Discard, c.f)
			}
		}()
	}
	go e.finish()
	return e, nil
}

// finish waits for the shim, then for its output, then reads the result.
func (e *nsExec) finish() {
	defer close(e.done)
	_ = e.shim.wait(context.Background())
	// A shim started by the spawner is the spawner's child: its status is
	// not ours to collect.
	how := "ended"
	if ws, ok := e.shim.reap(); ok {
		how = fmt.Sprintf("exit status %v", ws)
	}
	_ = e.shim.close()
	e.copies.Wait()
	if e.stdin != nil {
		e.stdin.Close() // unblocks a stdin copy still writing
	}
	st, err := readExec(e.dir, e.id)
	switch {
	case err != nil:
		e.err = err
	case st.Result == nil:
		e.err = fmt.Errorf("exec %s ended without a result (shim %s; sandbox destroyed?): %w", e.id, how, errdefs.ErrUnavailable)
	default:
		e.res = st.Result
	}
}

// readExec reads the result file of an exec or, while it runs, its
// pending file: the first line is the result, or "running <shim pid>
// <shim start time> <pid>"; the second is the caller's record.
func readExec(dir, execID string) (*ExecState, error) {
	if st, err := readResultFile(dir, execID); st != nil || err != nil {
		return st, err
	}
	b, err := os.ReadFile(filepath.Join(dir, pendingFile))
	if err != nil {
		// Not written yet, or just renamed to the result.
		if st, err := readResultFile(dir, execID); st != nil || err != nil {
			return st, err
		}
		if _, serr := os.Stat(dir); serr != nil {
			return nil, fmt.Errorf("exec %s: %w", execID, errdefs.ErrNotFound)
		}
		return &ExecState{}, nil // starting
	}
	first, rest, _ := bytes.Cut(b, []byte{'\n'})
	st := &ExecState{Record: firstLine(rest)}
	var shimPid int
	var start uint64
	// Shims before the pid field wrote two numbers.
	if n, _ := fmt.Sscanf(string(first), "running %d %d %d", &shimPid, &start, &st.Pid); n >= 2 && !procRunning(shimPid, start) {
		// It may have written the result just before exiting.
		if done, err := readResultFile(dir, execID); done != nil || err != nil {
			return done, err
		}
		st.Lost = true
	}
	return st, nil
}

// readResultFile reads the state of an ended exec; nil without a result.
func readResultFile(dir, execID string) (*ExecState, error) {
	b, err := os.ReadFile(filepath.Join(dir, resultFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	first, rest, _ := bytes.Cut(b, []byte{'\n'})
	var res ExecResult
	if err := json.Unmarshal(first, &res); err != nil {
		return nil, fmt.Errorf("exec %s result: %w", execID, err)
	}
	res.OutputBytes = keptBytes(dir)
	return &ExecState{Record: firstLine(rest), Pid: res.Pid, Result: &res}, nil
}

// firstLine is b up to its first newline, nil if that is empty.
func firstLine(b []byte) []byte {
	if line, _, _ := bytes.Cut(b, []byte{'\n'}); len(line) > 0 {
		return line
	}
	return nil
}

func (r *NamespaceRuntime) execDir(id, execID string) (string, error) {
	if !execIDRE.MatchString(execID) {
		return "", fmt.Errorf("exec id %q is malformed: %w", execID, errdefs.ErrInvalidArgument)
	}
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	return filepath.Join(sb.dir, execsDir, execID), nil
}

// ExecResult reads the recorded result of an exec, also of one that ended
// while no server ran. An exec whose shim died without recording a result
// (its sandbox was destroyed, or it was killed) is an ErrUnavailable error.
func (r *NamespaceRuntime) ExecResult(id, execID string) (*ExecResult, bool, error) {
	st, err := r.ExecState(id, execID)
	switch {
	case err != nil:
		return nil, false, err
	case st.Lost:
		return nil, false, fmt.Errorf("exec %s ended without a result: %w", execID, errdefs.ErrUnavailable)
	}
	return st.Result, st.Result != nil, nil
}

// ExecState implements Runtime.
func (r *NamespaceRuntime) ExecState(id, execID string) (*ExecState, error) {
	dir, err := r.execDir(id, execID)
	if err != nil {
		return nil, err
	}
	return readExec(dir, execID)
}

// ExecOutput returns the kept output of stream ("stdout" or "stderr") of an
// exec: the tail of at most its output cap.
func (r *NamespaceRuntime) ExecOutput(id, execID, stream string) ([]byte, error) {
	rc, _, err := r.OpenExecOutput(id, execID, stream)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// OpenExecOutput implements Runtime: the older half of the kept tail, then
// the current one. Of a running exec it is the tail as of now: a rotation
// between the two opens can repeat or skip up to half the cap.
func (r *NamespaceRuntime) OpenExecOutput(id, execID, stream string) (io.ReadCloser, int64, error) {
	if stream != StdoutLog && stream != StderrLog {
		return nil, 0, fmt.Errorf("stream %q: want stdout or stderr: %w", stream, errdefs.ErrInvalidArgument)
	}
	dir, err := r.execDir(id, execID)
	if err != nil {
		return nil, 0, err
	}
	if _, err := os.Stat(dir); err != nil {
		return nil, 0, fmt.Errorf("exec %s: %w", execID, errdefs.ErrNotFound)
	}
	out := &keptOutput{}
	for _, name := range []string{stream + olderHalfSuffix, stream} {
		f, err := os.Open(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // log files are created on first output
		}
		if err == nil {
			var st os.FileInfo
			if st, err = f.Stat(); err == nil {
				out.files = append(out.files, f)
				out.size += st.Size()
				continue
			}
			f.Close()
		}
		out.Close()
		return nil, 0, err
	}
	readers := make([]io.Reader, len(out.files))
	for i, f := range out.files {
		readers[i] = f
	}
	out.r = io.MultiReader(readers...)
	return out, out.size, nil
}

// keptOutput reads the halves of a kept stream in order.
type keptOutput struct {
	r     io.Reader
	files []*os.File
	size  int64
}

func (k *keptOutput) Read(p []byte) (int, error) { return k.r.Read(p) }

func (k *keptOutput) Close() error {
	for _, f := range k.files {
		f.Close()
	}
	return nil
}

// keptBytes is what an exec's kept output takes on disk (both streams,
// both halves).
func keptBytes(dir string) int64 {
	var n int64
	for _, name := range []string{StdoutLog, StdoutLog + olderHalfSuffix, StderrLog, StderrLog + olderHalfSuffix} {
		var st unix.Stat_t
		if unix.Stat(filepath.Join(dir, name), &st) == nil {
			n += st.Size
		}
	}
	return n
}

// RemoveExec implements Runtime.
func (r *NamespaceRuntime) RemoveExec(id, execID string) error {
	dir, err := r.execDir(id, execID)
	if err != nil {
		return err
	}
	// A recorded result means the shim is done with the directory; only
	// without one is the (dearer) running check needed.
	if unix.Access(filepath.Join(dir, resultFile), unix.F_OK) != nil {
		_, done, err := r.ExecResult(id, execID)
		switch {
		case errdefs.IsNotFound(err):
			return err
		case err == nil && !done:
			return fmt.Errorf("exec %s is still running: %w", execID, errdefs.ErrFailedPrecondition)
		}
	}
	// The files an exec leaves are known: unlinking them by name costs
	// less than RemoveAll's reading of the directory (run after every
	// exec once a sandbox's history is full).
	for _, name := range execFiles {
		if err := unix.Unlink(filepath.Join(dir, name)); err != nil && err != unix.ENOENT {
			return os.RemoveAll(dir)
		}
	}
	if err := unix.Rmdir(dir); err != nil && err != unix.ENOENT {
		return os.RemoveAll(dir) // something unexpected in it
	}
	return nil
}

// ListExecs implements Runtime.
func (r *NamespaceRuntime) ListExecs(id string) ([]string, error) {
	sb, err := r.get(id)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(filepath.Join(sb.dir, execsDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		if execIDRE.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// execFiles are the files of an exec's directory.
var execFiles = []string{resultFile, pendingFile, StdoutLog, StdoutLog + olderHalfSuffix, StderrLog, StderrLog + olderHalfSuffix}
