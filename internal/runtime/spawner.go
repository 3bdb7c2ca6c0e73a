package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/runtime/shim"
)

// spawner is the runtime's end of the shim's spawner mode, a fork server
// (see package shim, spawner.c): one process, started lazily by exec of the
// shim binary, that forks every init and exec shim on request. A fork of it
// skips the exec of the dsec binary and libc's static start-up that a
// fresh shim pays (about 1 ms of CPU each on a VM, mostly CPUID exits).
//
// Requests are serialised: a request and its reply take tens of
// microseconds, so one spawner keeps up with the creates and execs of a
// node. If the spawner dies it is restarted once and the request repeated;
// its children wait for the reply to have been sent before they do
// anything, so a request that got no reply started nothing that runs. If
// it cannot be started or keeps failing, spawn reports errNoSpawner for
// good and startShim forks and execs the shim itself, as it did before.
type spawner struct {
	path string   // shim binary
	null *os.File // the runtime's /dev/null, the spawner's stdio
	log  *slog.Logger
	env  []string // added to the spawner's environment (tests)

	sem    chan struct{} // held for a request and its reply, and guards what follows
	conn   *net.UnixConn // nil: not running
	proc   *proc
	off    bool // failed for good
	closed bool
}

// errNoSpawner means: start the shim without the spawner.
var errNoSpawner = errors.New("no spawner")

// spawnTimeout bounds one request and reply. The spawner answers in well
// under a millisecond; only a stopped or wedged one takes longer, and it
// is then replaced.
var spawnTimeout = 10 * time.Second

// spawnerArgv0 is the spawner's command line. Its children overwrite the
// argument area with theirs ("init", "exec"), so /proc/PID/cmdline of a
// sandbox's PID 1 reads "init\x00" as when it was exec'd so: the area must
// be exactly as long as theirs (shrinking it takes CAP_SYS_RESOURCE). Its
// comm, which ps and pgrep show, is "dsec-spawner".
const spawnerArgv0 = "dsec"

// cloneError is a failure of the spawner's clone3 (EAGAIN at the pids
// limit, ENOMEM, ENOSPC for pid namespaces): the same error a fork and
// exec would have got.
type cloneError struct{ errno syscall.Errno }

func (e *cloneError) Error() string { return "clone: " + e.errno.Error() }
func (e *cloneError) Unwrap() error { return e.errno }

func newSpawner(path string, null *os.File, log *slog.Logger) *spawner {
	return &spawner{path: path, null: null, log: log, sem: make(chan struct{}, 1)}
}

// spawn starts a child of the spawner in mode (shim.SpawnInit or
// shim.SpawnExec) with the namespaces of flags and files as its
// descriptors 0..n-1, and returns its pid and a pidfd. ctx bounds the wait
// for the spawner and for the reply (giving up on a reply costs the
// spawner, see roundTrip).
func (s *spawner) spawn(ctx context.Context, mode uint32, flags uintptr, files []int) (int, int, error) {
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return -1, -1, ctx.Err()
	}
	defer func() { <-s.sem }()
	if s.closed {
		return -1, -1, fmt.Errorf("runtime closed: %w", errdefs.ErrFailedPrecondition)
	}
	for attempt := 0; !s.off; attempt++ {
		if s.conn == nil {
			if err := s.start(); err != nil {
				s.disable("cannot start the spawner", err)
				break
			}
		}
		pid, pidfd, err := s.roundTrip(ctx, mode, flags, files)
		var ce *cloneError
		switch {
		case err == nil:
			return pid, pidfd, nil
		case errors.As(err, &ce) && ce.errno != unix.ENOSYS && ce.errno != unix.EINVAL && ce.errno != unix.EPERM:
			return -1, -1, err
		}
		// The spawner is gone, wedged or cannot clone: nothing of this
		// request runs (see above), so it can be asked again.
		s.discard()
		if cerr := ctx.Err(); cerr != nil {
			return -1, -1, cerr
		}
		if ce != nil || attempt > 0 {
			s.disable("the spawner keeps failing", err)
			break
		}
		s.log.Warn("spawner gone; restarting it", "err", err)
	}
	return -1, -1, errNoSpawner
}

// start runs a new spawner with one end of a socket pair as its fd 3.
func (s *spawner) start() error {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	null := s.null.Fd()
	pidfd := -1
	pid, err := syscall.ForkExec(s.path, []string{spawnerArgv0}, &syscall.ProcAttr{
		Env:   append([]string{shim.EnvVar + "=" + shim.ModeSpawner}, s.env...),
		Files: []uintptr{null, null, null, uintptr(sp[1])},
		// Own session and no parent-death signal, like the shims it
		// starts: ^C to the server's group must not reach it, and it ends
		// by itself when its socket closes.
		Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	})
	unix.Close(sp[1])
	if err != nil {
		unix.Close(sp[0])
		return fmt.Errorf("start spawner: %w", err)
	}
	p, err := newProc(pid, pidfd)
	if err != nil {
		unix.Close(sp[0])
		_ = unix.Kill(pid, unix.SIGKILL)
		return err
	}
	f := os.NewFile(uintptr(sp[0]), "spawner")
	c, err := net.FileConn(f)
	f.Close()
	uc, ok := c.(*net.UnixConn)
	if err != nil || !ok {
		if c != nil {
			c.Close()
		}
		_ = p.signal(unix.SIGKILL)
		go reapSpawner(p)
		return fmt.Errorf("spawner socket: %v", err)
	}
	s.conn, s.proc = uc, p
	go reapSpawner(p)
	return nil
}

// reapSpawner collects the exit status of a spawner once it ends (it is
// the server's child), so none is left a zombie.
func reapSpawner(p *proc) {
	_ = p.wait(context.Background())
	p.reap()
	_ = p.close()
}

// roundTrip sends one request and reads its reply. When the reply is late
// (spawnTimeout) or ctx ends first, the spawner is killed: a reply it sent
// before it died is still read (its child runs), and without one no child
// of the request runs.
func (s *spawner) roundTrip(ctx context.Context, mode uint32, flags uintptr, files []int) (int, int, error) {
	var req [shim.SpawnRequestSize]byte
	nativeEndian.PutUint32(req[0:], mode)
	nativeEndian.PutUint32(req[4:], uint32(len(files)))
	nativeEndian.PutUint64(req[8:], uint64(flags))
	_ = s.conn.SetDeadline(time.Now().Add(spawnTimeout))
	if _, _, err := s.conn.WriteMsgUnix(req[:], unix.UnixRights(files...), nil); err != nil {
		return -1, -1, fmt.Errorf("send to spawner: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = s.conn.SetReadDeadline(aLongTimeAgo) })
	pid, pidfd, err := s.readReply()
	stop()
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return pid, pidfd, err
	}
	_ = s.proc.signal(unix.SIGKILL)
	wctx, cancel := context.WithTimeout(context.Background(), spawnTimeout)
	_ = s.proc.wait(wctx)
	cancel()
	_ = s.conn.SetReadDeadline(time.Now().Add(spawnTimeout))
	if pid, pidfd, rerr := s.readReply(); rerr == nil {
		s.discard()
		return pid, pidfd, nil
	}
	if ctx.Err() != nil {
		return -1, -1, ctx.Err()
	}
	return -1, -1, fmt.Errorf("spawner did not answer within %v: %w", spawnTimeout, err)
}

// readReply reads one reply: the child's pid and pidfd, or the clone's
// errno as a *cloneError.
func (s *spawner) readReply() (int, int, error) {
	var rep [shim.SpawnReplySize + 1]byte
	oob := make([]byte, unix.CmsgSpace(4*2))
	n, oobn, mflags, _, err := s.conn.ReadMsgUnix(rep[:], oob)
	var fds []int
	if oobn > 0 {
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for i := range msgs {
				if rights, rerr := unix.ParseUnixRights(&msgs[i]); rerr == nil {
					fds = append(fds, rights...)
				}
			}
		}
	}
	closeFDs := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if err != nil || n == 0 {
		closeFDs()
		if err == nil {
			err = unix.ECONNRESET // EOF: the spawner exited
		}
		return -1, -1, fmt.Errorf("spawner reply: %w", err)
	}
	if n != shim.SpawnReplySize || mflags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFDs()
		return -1, -1, fmt.Errorf("spawner: malformed reply of %d bytes", n)
	}
	pid := int(int32(nativeEndian.Uint32(rep[0:])))
	if errno := syscall.Errno(nativeEndian.Uint32(rep[4:])); errno != 0 {
		closeFDs()
		return -1, -1, &cloneError{errno}
	}
	if pid <= 0 || len(fds) != 1 {
		closeFDs()
		return -1, -1, fmt.Errorf("spawner: reply pid %d with %d descriptors", pid, len(fds))
	}
	return pid, fds[0], nil
}

// discard drops the current spawner; killing it is harmless to its
// children, which outlive it anyway.
func (s *spawner) discard() {
	if s.conn == nil {
		return
	}
	_ = s.conn.Close()
	_ = s.proc.signal(unix.SIGKILL)
	s.conn, s.proc = nil, nil
}

func (s *spawner) disable(msg string, err error) {
	s.off = true
	s.log.Warn(msg+"; starting shims by fork and exec from now on", "err", err)
}

// close ends the spawner (it exits when its socket closes); its children
// run on.
func (s *spawner) close() {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	s.closed = true
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn, s.proc = nil, nil
	}
}

// pid is the running spawner's pid, 0 if none (tests).
func (s *spawner) pid() int {
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid
}
