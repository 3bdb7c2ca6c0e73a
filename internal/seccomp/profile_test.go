//go:build linux && amd64

package seccomp

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/testutil"
)

type want int

const (
	deny         want = iota // the profile's plain denial (EPERM, or the marker)
	allowed                  // neither denied nor killed; the kernel's answer is not checked
	ok                       // allowed and succeeds
	enosys                   // ENOSYS from the filter
	eopnotsupp               // EOPNOTSUPP from the filter
	nativeENOSYS             // ENOSYS, which is also what the kernel says without a filter
	killed                   // SIGSYS kills the process
)

func TestProfile(t *testing.T) {
	all := Options{AllowUserNS: true, AllowPtrace: true, AllowUserfaultfd: true}
	cases := []struct {
		probe string
		opts  Options
		want  want
	}{
		{"mount", Options{}, deny},
		{"mount", all, deny},
		{"umount2", Options{}, deny},
		{"pivot_root", Options{}, deny},
		{"move_mount", Options{}, deny},
		{"open_tree", Options{}, deny},
		{"fsopen", Options{}, deny},
		{"fsconfig", Options{}, deny},
		{"fsmount", Options{}, deny},
		{"fspick", Options{}, deny},
		{"mount_setattr", Options{}, deny},
		{"kexec_load", Options{}, deny},
		{"kexec_file_load", Options{}, deny},
		{"init_module", Options{}, deny},
		{"finit_module", Options{}, deny},
		{"delete_module", Options{}, deny},
		{"create_module", Options{}, deny},
		{"get_kernel_syms", Options{}, deny},
		{"query_module", Options{}, deny},
		{"uselib", Options{}, deny},
		{"_sysctl", Options{}, deny},
		{"bpf", Options{}, deny},
		{"bpf", all, deny},
		{"perf_event_open", Options{}, deny},
		{"lookup_dcookie", Options{}, deny},
		{"swapon", Options{}, deny},
		{"swapoff", Options{}, deny},
		{"reboot", Options{}, deny},
		{"syslog", Options{}, deny},
		{"acct", Options{}, deny},
		{"quotactl", Options{}, deny},
		{"quotactl_fd", Options{}, deny},
		{"nfsservctl", Options{}, deny},
		{"vhangup", Options{}, deny},
		{"settimeofday", Options{}, deny},
		{"clock_settime", Options{}, deny},
		{"adjtimex", Options{}, deny},
		{"clock_adjtime", Options{}, deny},
		{"keyctl", Options{}, deny},
		{"add_key", Options{}, deny},
		{"request_key", Options{}, deny},
		{"open_by_handle_at", Options{}, deny},
		{"name_to_handle_at", Options{}, deny},
		{"iopl", Options{}, deny},
		{"ioperm", Options{}, deny},
		{"setns", Options{}, deny},
		{"setns", all, deny},
		{"io_uring_setup", Options{}, enosys},
		{"io_uring_enter", Options{}, enosys},
		{"io_uring_register", Options{}, enosys},
		{"ptrace", Options{}, deny},
		{"ptrace", Options{AllowPtrace: true}, allowed},
		{"process_vm_readv", Options{}, deny},
		{"process_vm_readv", Options{AllowPtrace: true}, ok},
		{"process_vm_writev", Options{}, deny},
		{"process_vm_writev", Options{AllowPtrace: true}, ok},
		{"userfaultfd", Options{}, deny},
		{"userfaultfd", Options{AllowUserfaultfd: true}, allowed},
		{"unshare_newuser", Options{}, deny},
		{"unshare_newuser", Options{AllowUserNS: true}, allowed},
		{"unshare_newuts", Options{}, allowed},
		{"clone_newuser", Options{}, deny},
		{"clone_newuser_hi", Options{}, deny},
		{"clone_newuser", Options{AllowUserNS: true}, allowed},
		{"clone3", Options{}, enosys},
		{"clone3", Options{AllowUserNS: true}, allowed},
		{"personality_norand", Options{}, deny},
		{"personality_norand_hi", Options{}, deny},
		{"personality_query", Options{}, ok},
		{"personality_linux32", Options{}, ok},
		{"ioctl_ficlone", Options{}, eopnotsupp},
		{"ioctl_ficlonerange", Options{}, eopnotsupp},
		{"ioctl_fideduperange", Options{}, eopnotsupp},
		{"ioctl_xfs_swapext", Options{}, eopnotsupp},
		{"ioctl_xfs_exchange", Options{}, eopnotsupp},
		{"ioctl_tiocsti", Options{}, deny},
		{"ioctl_tiocsti_hi", Options{}, deny},
		{"ioctl_tioclinux", Options{}, deny},
		{"ioctl_tcgets_pty", Options{}, ok},
		{"ioctl_fionread_pipe", Options{}, ok},
		{"ioctl_fs_setflags", Options{}, allowed},
		{"x32_getpid", Options{}, killed},
		{"i386_getpid", Options{}, killed},
		{"nr_minus_one", Options{}, nativeENOSYS},
		{"exec_true", Options{}, ok},
		{"sh_fork", Options{}, ok},
		{"file_io", Options{}, ok},
		{"threads", Options{}, ok},
	}
	for _, tc := range cases {
		name := tc.probe
		if tc.opts != (Options{}) {
			name += "/relaxed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if tc.probe == "i386_getpid" {
				// Without IA-32 emulation int $0x80 faults before seccomp
				// sees it; that is a missing kernel feature.
				c := runProbe(t, tc.probe, "control", tc.opts, unix.EPERM)
				testutil.RequiresFeature(t, "IA-32 emulation (int $0x80)", c.killed == 0 && c.errno == 0)
			}
			// With the marker errno, then with the real DefaultFilter.
			for _, eperm := range []unix.Errno{marker, unix.EPERM} {
				got := runProbe(t, tc.probe, "filter", tc.opts, eperm)
				check(t, tc.probe, eperm, tc.want, got)
			}
			// A filter-specific errno must not be what the kernel says by
			// itself, or the test would prove nothing.
			switch tc.want {
			case enosys, eopnotsupp, killed:
				c := runProbe(t, tc.probe, "control", tc.opts, unix.EPERM)
				if c.killed != 0 {
					t.Fatalf("%s without a filter: killed by %v", tc.probe, c.killed)
				}
				if (tc.want == enosys && c.errno == unix.ENOSYS) || (tc.want == eopnotsupp && c.errno == unix.EOPNOTSUPP) {
					t.Fatalf("%s without a filter already returns %v; the probe cannot tell", tc.probe, c.errno)
				}
			}
		})
	}
}

func check(t *testing.T, probe string, eperm unix.Errno, w want, got outcome) {
	t.Helper()
	if w == killed {
		if got.killed != syscall.SIGSYS {
			t.Fatalf("%s: got %+v, want killed by SIGSYS", probe, got)
		}
		return
	}
	if got.killed != 0 {
		t.Fatalf("%s: killed by %v", probe, got.killed)
	}
	switch w {
	case deny:
		if got.errno != eperm {
			t.Fatalf("%s: errno %d (%v), want %d (%v)", probe, got.errno, got.errno, eperm, eperm)
		}
	case allowed:
		if got.errno == marker || (eperm == marker && got.errno == eperm) {
			t.Fatalf("%s: denied by the filter (%v), want allowed", probe, got.errno)
		}
	case ok:
		if got.errno != 0 {
			t.Fatalf("%s: errno %v, want success", probe, got.errno)
		}
	case enosys, nativeENOSYS:
		if got.errno != unix.ENOSYS {
			t.Fatalf("%s: errno %v, want ENOSYS", probe, got.errno)
		}
	case eopnotsupp:
		if got.errno != unix.EOPNOTSUPP {
			t.Fatalf("%s: errno %v, want EOPNOTSUPP", probe, got.errno)
		}
	}
}
