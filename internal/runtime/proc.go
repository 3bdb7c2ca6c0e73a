package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// proc is a process held by a pidfd. Waiting uses Go's poller (a pidfd
// becomes readable when the process exits), so thousands of idle sandboxes
// do not pin thousands of threads in wait4.
type proc struct {
	pid int
	f   *os.File
}

func newProc(pid, pidfd int) (*proc, error) {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	return &proc{pid: pid, f: os.NewFile(uintptr(pidfd), "pidfd:"+strconv.Itoa(pid))}, nil
}

// openProc opens a pidfd for pid and checks that it is still the process
// that started at start (pid reuse guard).
func openProc(pid int, start uint64) (*proc, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, err
	}
	got, err := procStartTime(pid)
	if err != nil || got != start {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("pid %d was reused (start time %d, want %d)", pid, got, start)
		}
		return nil, err
	}
	return newProc(pid, fd)
}

// control runs fn with the raw pidfd, kept valid for the call.
func (p *proc) control(fn func(fd int)) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}

func (p *proc) signal(sig syscall.Signal) error {
	var serr error
	if err := p.control(func(fd int) { serr = unix.PidfdSendSignal(fd, sig, nil, 0) }); err != nil {
		return err
	}
	return serr
}

// exited reports without blocking whether the process has ended.
func (p *proc) exited() bool {
	done := false
	_ = p.control(func(fd int) {
		pf := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pf, 0)
		done = err == nil && n > 0
	})
	return done
}

var aLongTimeAgo = time.Unix(1, 0)

// wait blocks until the process has ended or ctx is done.
func (p *proc) wait(ctx context.Context) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = p.f.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		pf := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, perr := unix.Poll(pf, 0)
		return perr == nil && n > 0
	})
	if ctx.Err() != nil {
		_ = p.f.SetReadDeadline(time.Time{})
		return ctx.Err()
	}
	if errors.Is(err, os.ErrNoDeadline) {
		// Not pollable: fall back to checking periodically.
		for !p.exited() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return nil
	}
	return err
}

// reap collects the exit status if the process is our child (an adopted
// init is reaped by whoever inherited it). It returns the wait status.
func (p *proc) reap() (unix.WaitStatus, bool) {
	var info unix.Siginfo
	var ok bool
	var ws unix.WaitStatus
	_ = p.control(func(fd int) {
		err := unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil)
		ok = err == nil
	})
	if ok {
		// Siginfo for SIGCHLD: si_code at offset 8, si_status at offset 24.
		raw := (*[32]byte)(unsafePointer(&info))
		code := int32(nativeEndian.Uint32(raw[8:12]))
		status := int32(nativeEndian.Uint32(raw[24:28]))
		switch code {
		case 1: // CLD_EXITED
			ws = unix.WaitStatus(status << 8)
		default: // killed or dumped
			ws = unix.WaitStatus(status & 0x7f)
		}
	}
	return ws, ok
}

func (p *proc) close() error { return p.f.Close() }

// procStartTime is field 22 of /proc/PID/stat (clock ticks since boot).
func procStartTime(pid int) (uint64, error) {
	start, _, err := procStat(pid)
	return start, err
}

// procRunning reports whether pid is still the process that started at
// start and has not ended. A zombie has ended: a shim started by the
// spawner is reaped by the spawner, a moment after its pidfd said so.
func procRunning(pid int, start uint64) bool {
	got, state, err := procStat(pid)
	return err == nil && got == start && state != 'Z' && state != 'X'
}

// procStat returns the start time and the state of /proc/PID/stat.
func procStat(pid int) (uint64, byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	return start, f[0][0], err
}
