//go:build linux && amd64

package seccomp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/seccomp/internal/i386"
)

// The probes run in a re-executed test binary: installing a filter cannot
// be undone, so the parent test process stays unfiltered.
const (
	envProbe = "DSEC_SECCOMP_PROBE" // probe name
	envMode  = "DSEC_SECCOMP_MODE"  // "filter" or "control" (no filter)
	envErrno = "DSEC_SECCOMP_EPERM" // errno the filter uses for plain denials
	envOpts  = "DSEC_SECCOMP_OPTS"  // JSON Options
)

// marker replaces EPERM in the filter for most runs: no probed syscall
// returns it by itself, so seeing it proves the filter made the decision.
const marker = unix.EHWPOISON

func TestMain(m *testing.M) {
	if name := os.Getenv(envProbe); name != "" {
		os.Exit(childMain(name))
	}
	os.Exit(m.Run())
}

func childMain(name string) int {
	probe, ok := probes[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown probe %q\n", name)
		return 2
	}
	if os.Getenv(envMode) == "filter" {
		var opts Options
		if err := json.Unmarshal([]byte(os.Getenv(envOpts)), &opts); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		n, err := strconv.Atoi(os.Getenv(envErrno))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		var f Filter
		if unix.Errno(n) == unix.EPERM {
			f, err = DefaultFilter(opts) // exactly what callers get
		} else {
			f, err = build(unix.AUDIT_ARCH_X86_64, rules(opts, unix.Errno(n)))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		raw, err := f.MarshalBinary()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		// Load the serialised bytes, as the runtime's C shim does.
		if err := installRaw(raw); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	fmt.Printf("errno=%d\n", int(probe()))
	return 0
}

func sys(nr uintptr, args ...uintptr) unix.Errno {
	var a [6]uintptr
	copy(a[:], args)
	_, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	return e
}

func str(s string) uintptr {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return uintptr(unsafe.Pointer(p))
}

const (
	badFD           = ^uintptr(0) // -1
	noSuch          = 1 << 30     // a pid that does not exist
	highBit         = 1 << 32     // set in the upper half of a 64-bit argument
	addrNoRandomize = 0x0040000   // ADDR_NO_RANDOMIZE personality flag
)

// probes make each call with arguments that, without a filter, fail
// harmlessly (EFAULT, EBADF, EINVAL...) or succeed without side effects
// outside the child.
var probes = map[string]func() unix.Errno{
	"mount":             func() unix.Errno { return sys(unix.SYS_MOUNT, 0, 0, 0, 0, 0) },
	"umount2":           func() unix.Errno { return sys(unix.SYS_UMOUNT2, str("/nonexistent-dsec"), 0) },
	"pivot_root":        func() unix.Errno { return sys(unix.SYS_PIVOT_ROOT, 0, 0) },
	"move_mount":        func() unix.Errno { return sys(unix.SYS_MOVE_MOUNT, badFD, 0, badFD, 0, 0) },
	"open_tree":         func() unix.Errno { return sys(unix.SYS_OPEN_TREE, badFD, 0, 0) },
	"fsopen":            func() unix.Errno { return sys(unix.SYS_FSOPEN, 0, 0) },
	"fsconfig":          func() unix.Errno { return sys(unix.SYS_FSCONFIG, badFD, 0, 0, 0, 0) },
	"fsmount":           func() unix.Errno { return sys(unix.SYS_FSMOUNT, badFD, 0, 0) },
	"fspick":            func() unix.Errno { return sys(unix.SYS_FSPICK, badFD, 0, 0) },
	"mount_setattr":     func() unix.Errno { return sys(unix.SYS_MOUNT_SETATTR, badFD, 0, 0, 0, 0) },
	"kexec_load":        func() unix.Errno { return sys(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0xdeadbeef) },
	"kexec_file_load":   func() unix.Errno { return sys(unix.SYS_KEXEC_FILE_LOAD, badFD, badFD, 0, 0, 0xdeadbeef) },
	"init_module":       func() unix.Errno { return sys(unix.SYS_INIT_MODULE, 0, 0, 0) },
	"finit_module":      func() unix.Errno { return sys(unix.SYS_FINIT_MODULE, badFD, 0, 0) },
	"delete_module":     func() unix.Errno { return sys(unix.SYS_DELETE_MODULE, 0, 0) },
	"create_module":     func() unix.Errno { return sys(unix.SYS_CREATE_MODULE, 0, 0) },
	"get_kernel_syms":   func() unix.Errno { return sys(unix.SYS_GET_KERNEL_SYMS, 0) },
	"query_module":      func() unix.Errno { return sys(unix.SYS_QUERY_MODULE, 0, 0, 0, 0, 0) },
	"uselib":            func() unix.Errno { return sys(unix.SYS_USELIB, 0) },
	"_sysctl":           func() unix.Errno { return sys(unix.SYS__SYSCTL, 0) },
	"bpf":               func() unix.Errno { return sys(unix.SYS_BPF, 0xffff, 0, 0) },
	"perf_event_open":   func() unix.Errno { return sys(unix.SYS_PERF_EVENT_OPEN, 0, 0, badFD, badFD, 0) },
	"lookup_dcookie":    func() unix.Errno { return sys(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0) },
	"swapon":            func() unix.Errno { return sys(unix.SYS_SWAPON, 0, 0) },
	"swapoff":           func() unix.Errno { return sys(unix.SYS_SWAPOFF, 0) },
	"reboot":            func() unix.Errno { return sys(unix.SYS_REBOOT, 0, 0, 0, 0) }, // bad magic: EINVAL
	"syslog":            func() unix.Errno { return sys(unix.SYS_SYSLOG, 10, 0, 0) },   // SYSLOG_ACTION_SIZE_BUFFER
	"acct":              func() unix.Errno { return sys(unix.SYS_ACCT, str("/nonexistent-dsec/acct")) },
	"quotactl":          func() unix.Errno { return sys(unix.SYS_QUOTACTL, 0, 0, 0, 0) },
	"quotactl_fd":       func() unix.Errno { return sys(unix.SYS_QUOTACTL_FD, badFD, 0, 0, 0) },
	"nfsservctl":        func() unix.Errno { return sys(unix.SYS_NFSSERVCTL, 0, 0, 0) },
	"vhangup":           func() unix.Errno { return sys(unix.SYS_VHANGUP) }, // the child has no tty (setsid)
	"settimeofday":      func() unix.Errno { return sys(unix.SYS_SETTIMEOFDAY, 1, 0) },
	"clock_settime":     func() unix.Errno { return sys(unix.SYS_CLOCK_SETTIME, unix.CLOCK_REALTIME, 0) },
	"adjtimex":          func() unix.Errno { return sys(unix.SYS_ADJTIMEX, 0) },
	"clock_adjtime":     func() unix.Errno { return sys(unix.SYS_CLOCK_ADJTIME, unix.CLOCK_REALTIME, 0) },
	"keyctl":            func() unix.Errno { return sys(unix.SYS_KEYCTL, 0xffff, 0, 0, 0, 0) },
	"add_key":           func() unix.Errno { return sys(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0) },
	"request_key":       func() unix.Errno { return sys(unix.SYS_REQUEST_KEY, 0, 0, 0, 0) },
	"open_by_handle_at": func() unix.Errno { return sys(unix.SYS_OPEN_BY_HANDLE_AT, badFD, 0, 0) },
	"name_to_handle_at": func() unix.Errno { return sys(unix.SYS_NAME_TO_HANDLE_AT, badFD, 0, 0, 0, 0) },
	"iopl":              func() unix.Errno { return sys(unix.SYS_IOPL, 99) },
	"ioperm":            func() unix.Errno { return sys(unix.SYS_IOPERM, 0x10000, 1, 1) },
	"setns":             func() unix.Errno { return sys(unix.SYS_SETNS, badFD, 0) },
	"io_uring_setup":    func() unix.Errno { return sys(unix.SYS_IO_URING_SETUP, 1, 0) },
	"io_uring_enter":    func() unix.Errno { return sys(unix.SYS_IO_URING_ENTER, badFD, 0, 0, 0, 0, 0) },
	"io_uring_register": func() unix.Errno { return sys(unix.SYS_IO_URING_REGISTER, badFD, 0, 0, 0) },
	"ptrace":            func() unix.Errno { return sys(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, noSuch, 0, 0) },
	"process_vm_readv": func() unix.Errno {
		return sys(unix.SYS_PROCESS_VM_READV, uintptr(os.Getpid()), 0, 0, 0, 0, 0)
	},
	"process_vm_writev": func() unix.Errno {
		return sys(unix.SYS_PROCESS_VM_WRITEV, uintptr(os.Getpid()), 0, 0, 0, 0, 0)
	},
	"userfaultfd":      func() unix.Errno { return sys(unix.SYS_USERFAULTFD, 0xdeadbeef) },
	"unshare_newuser":  func() unix.Errno { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER) },
	"unshare_newuts":   func() unix.Errno { return sys(unix.SYS_UNSHARE, unix.CLONE_NEWUTS) },
	"clone_newuser":    func() unix.Errno { return sys(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS) }, // EINVAL unfiltered
	"clone_newuser_hi": func() unix.Errno { return sys(unix.SYS_CLONE, highBit|unix.CLONE_NEWUSER|unix.CLONE_FS) },
	"clone3":           func() unix.Errno { return sys(unix.SYS_CLONE3, 0, 0) },
	"personality_norand": func() unix.Errno {
		return sys(unix.SYS_PERSONALITY, addrNoRandomize)
	},
	"personality_norand_hi": func() unix.Errno {
		return sys(unix.SYS_PERSONALITY, highBit|addrNoRandomize)
	},
	"personality_query":   func() unix.Errno { return sys(unix.SYS_PERSONALITY, 0xffffffff) },
	"personality_linux32": func() unix.Errno { return sys(unix.SYS_PERSONALITY, 0x8) },
	"ioctl_ficlone":       func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlFICLONE, 0) },
	"ioctl_ficlonerange":  func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlFICLONERANGE, 0) },
	"ioctl_fideduperange": func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlFIDEDUPERANGE, 0) },
	"ioctl_xfs_swapext":   func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlXFSSwapExt, 0) },
	"ioctl_xfs_exchange":  func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlXFSExchangeRange, 0) },
	"ioctl_tiocsti":       func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlTIOCSTI, 0) },
	"ioctl_tiocsti_hi":    func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, highBit|ioctlTIOCSTI, 0) },
	"ioctl_tioclinux":     func() unix.Errno { return sys(unix.SYS_IOCTL, badFD, ioctlTIOCLINUX, 0) },
	"ioctl_tcgets_pty":    probeTCGETS,
	"ioctl_fionread_pipe": probeFIONREAD,
	"ioctl_fs_setflags":   probeSetflags,
	"x32_getpid":          func() unix.Errno { return sys(x32SyscallBit | unix.SYS_GETPID) },
	"nr_minus_one":        func() unix.Errno { return sys(^uintptr(0)) },
	"i386_getpid":         probeI386,
	"exec_true":           probeExecTrue,
	"sh_fork":             probeShFork,
	"file_io":             probeFileIO,
	"threads":             probeThreads,
}

func probeTCGETS() unix.Errno {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err.(unix.Errno)
	}
	defer unix.Close(fd)
	_, err = unix.IoctlGetTermios(fd, unix.TCGETS)
	return toErrno(err)
}

func probeFIONREAD() unix.Errno {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return toErrno(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if _, err := unix.Write(p[1], []byte("abc")); err != nil {
		return toErrno(err)
	}
	n, err := unix.IoctlGetInt(p[0], unix.TIOCINQ)
	if err == nil && n != 3 {
		return unix.EBADMSG
	}
	return toErrno(err)
}

// probeSetflags sets no flags (0) on a temp file: allowed by the profile;
// the file system may still answer ENOTTY/EOPNOTSUPP.
func probeSetflags() unix.Errno {
	f, err := os.CreateTemp("", "dsec-seccomp")
	if err != nil {
		return unix.EIO
	}
	defer os.Remove(f.Name())
	defer f.Close()
	return toErrno(unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, 0))
}

func probeI386() unix.Errno {
	const getpid386 = 20
	if int(i386.Syscall3(getpid386, 0, 0, 0)) != os.Getpid() {
		return unix.EBADMSG
	}
	return 0
}

func probeExecTrue() unix.Errno {
	if err := exec.Command("/bin/true").Run(); err != nil {
		return unix.ECHILD
	}
	return 0
}

// probeShFork runs a pipeline, so a C libc forks (and may try clone3
// first, falling back on ENOSYS).
func probeShFork() unix.Errno {
	out, err := exec.Command("/bin/sh", "-c", "echo hi | cat").Output()
	if err != nil || string(out) != "hi\n" {
		return unix.ECHILD
	}
	return 0
}

func probeFileIO() unix.Errno {
	dir, err := os.MkdirTemp("", "dsec-seccomp")
	if err != nil {
		return unix.EIO
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("data"), 0o644); err != nil {
		return unix.EIO
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "data" {
		return unix.EIO
	}
	return 0
}

// probeThreads makes the Go runtime create fresh OS threads (clone with
// CLONE_THREAD) after the filter is in place.
func probeThreads() unix.Errno {
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			_ = unix.Gettid()
		})
	}
	wg.Wait()
	return 0
}

func toErrno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}

// outcome is how a probe child ended.
type outcome struct {
	errno  unix.Errno
	killed syscall.Signal // non-zero if a signal ended the child
}

func runProbe(t *testing.T, name, mode string, opts Options, eperm unix.Errno) outcome {
	t.Helper()
	o, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envProbe+"="+name, envMode+"="+mode, envOpts+"="+string(o),
		envErrno+"="+strconv.Itoa(int(eperm)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // no controlling tty for vhangup
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return outcome{killed: ws.Signal()}
		}
	}
	if err != nil {
		t.Fatalf("probe %s (%s): %v\nstderr: %s", name, mode, err, stderr.String())
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(stdout.String()), "errno=")
	if !ok {
		t.Fatalf("probe %s (%s): unexpected output %q", name, mode, stdout.String())
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("probe %s (%s): %v", name, mode, err)
	}
	return outcome{errno: unix.Errno(n)}
}
