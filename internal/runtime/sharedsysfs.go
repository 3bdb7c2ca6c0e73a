package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// sharedSysfs is one read-only sysfs mount, made from a network namespace
// that holds only an up loopback, which every sandbox with its own
// loopback-only namespace binds as its /sys. What that sandbox would see
// in a sysfs of its own is the same: the one device is lo (its counters
// are the template's, not the sandbox's).
//
// Why: every new sysfs mount makes the kernel compare it with every sysfs
// superblock on the host (sget_fc, under a global lock), which made
// creates slower as sandboxes were held (8-19% of the CPU at 5,000), and
// every superblock costs each memory cgroup a shrinker slot. A bind mount
// makes no superblock.
//
// The template's namespace lives as long as its netns mount (the sysfs
// mount does not hold it), so close unmounts both only when no sandbox is
// left; sandboxes keep their bind mounts in any case.
type sharedSysfs struct {
	dir     string // holds sys (the sysfs mount) and netns (its namespace)
	mu      sync.Mutex
	mounted bool
}

func (s *sharedSysfs) sysDir() string    { return filepath.Join(s.dir, "sys") }
func (s *sharedSysfs) netnsFile() string { return filepath.Join(s.dir, "netns") }

// path mounts the template on first use and returns its mount point.
func (s *sharedSysfs) path() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounted {
		return s.sysDir(), nil
	}
	if loopbackOnlySysfs(s.sysDir()) {
		// Kept by a server that stopped with sandboxes left, or was killed.
		s.mounted = true
		return s.sysDir(), nil
	}
	s.unmount() // a stale template whose namespace is gone
	if err := os.MkdirAll(s.sysDir(), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(s.netnsFile(), nil, 0o600); err != nil {
		return "", err
	}
	if err := mountLoopbackSysfs(s.sysDir(), s.netnsFile()); err != nil {
		s.unmount()
		return "", fmt.Errorf("shared sysfs in %s: %w", s.dir, err)
	}
	s.mounted = true
	return s.sysDir(), nil
}

// close unmounts the template when no sandbox is left (live == 0). With
// sandboxes left it stays, for them and for the next server: their /sys
// shows the template's namespace, which lives as long as its netns mount.
func (s *sharedSysfs) close(live int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if live > 0 {
		return nil
	}
	s.mounted = false
	return s.unmount()
}

func (s *sharedSysfs) unmount() error {
	var errs []error
	for _, p := range []string{s.sysDir(), s.netnsFile()} {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// loopbackOnlySysfs reports whether dir is a sysfs mount whose network
// namespace has only lo (its devices are gone once the namespace is).
func loopbackOnlySysfs(dir string) bool {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil || st.Type != unix.SYSFS_MAGIC {
		return false
	}
	ents, err := os.ReadDir(dir + "/class/net")
	if err != nil {
		return false
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return slices.Equal(names, []string{"lo"})
}

// mountLoopbackSysfs mounts at dir, read-only and private, the sysfs of a
// new network namespace with lo up, and keeps that namespace alive by a
// bind mount of it on nsFile (as ip netns does): the sysfs mount alone
// does not, and without its namespace it shows no devices. sysfs shows the
// network namespace of the task that mounts it, so a locked OS thread
// enters a new one for the mount and then returns to its own.
func mountLoopbackSysfs(dir, nsFile string) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		err = mountSysfsHere(dir, nsFile)
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the thread ends with this goroutine, and no
			// other goroutine runs in the template's namespace.
			errc <- errors.Join(err, fmt.Errorf("return to own network namespace: %w", serr))
			return
		}
		goruntime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// mountSysfsHere does mountLoopbackSysfs's work in the calling thread's
// (new) network namespace.
func mountSysfsHere(dir, nsFile string) error {
	if err := loopbackUp(); err != nil {
		return err
	}
	if err := unix.Mount("/proc/thread-self/ns/net", nsFile, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("keep network namespace: %w", err)
	}
	if err := unix.Mount("sysfs", dir, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount sysfs: %w", err)
	}
	for _, p := range []string{dir, nsFile} {
		if err := unix.Mount("", p, "", unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make %s private: %w", p, err)
		}
	}
	return nil
}

// loopbackUp brings lo up in the calling thread's network namespace, as
// each sandbox's init does in its own.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
