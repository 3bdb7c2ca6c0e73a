package misconduct

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
	"golang.org/x/sys/unix"
)

// ioctlNames are the extent-sharing and extent-swapping ioctls the tool
// tries; XFS_IOC_SWAPEXT is the one the issue reports.
var ioctlNames = []string{"FICLONE", "FICLONERANGE", "FIDEDUPERANGE", "XFS_IOC_SWAPEXT", "XFS_IOC_EXCHANGE_RANGE"}

// Swapping or sharing extents with a protected file gets around its
// permissions (and around per-sandbox disk accounting). The filter answers
// EOPNOTSUPP, what a file system without reflink says; on fd -1 the kernel
// would say EBADF, so EOPNOTSUPP there proves the filter saw the call.
func TestExtentIoctlsBlocked(t *testing.T) {
	testutil.RequiresRoot(t)
	// The control: on the host, the kernel itself answers fd -1.
	out, err := exec.Command(suite.attack, "ioctls", t.TempDir()).Output()
	if err != nil {
		t.Fatal(err)
	}
	var host map[string]string
	if err := json.Unmarshal(out, &host); err != nil {
		t.Fatal(err)
	}
	for _, n := range ioctlNames {
		if got := host[n+"/badfd"]; got != "EBADF" {
			t.Fatalf("host control: %s on fd -1 = %s, want EBADF", n, got)
		}
	}

	id := newSandbox(t, client.SandboxSpec{DiskBytes: 64 << 20})
	putAttack(t, id)
	for _, dir := range []string{"/workspace", "/tmp"} {
		for _, user := range []string{"", "user"} {
			if user != "" {
				sh(t, id, "mkdir -p "+dir+"/u && chown user "+dir+"/u")
			}
			d := dir
			if user != "" {
				d = dir + "/u"
			}
			var got map[string]string
			attack(t, id, user, &got, "ioctls", d)
			for _, n := range ioctlNames {
				for _, target := range []string{"file", "badfd"} {
					if e := got[n+"/"+target]; e != "ENOTSUP" {
						t.Errorf("%s (user %q) %s on %s: %s, want EOPNOTSUPP from the filter", dir, user, n, target, e)
					}
				}
			}
			// dst still holds its own data, not src's.
			if sum := sh(t, id, "tr -d d < "+d+"/dst | wc -c"); strings.TrimSpace(sum) != "0" {
				t.Errorf("%s: dst changed: %s bytes not 'd'", d, sum)
			}
		}
	}
	assertHealthy(t)
}

// Kernel interfaces that are not namespaced or have a history of escapes
// (mount, new user namespaces, keyrings, bpf, perf, kexec, modules, ...)
// fail with EPERM; io_uring looks absent (ENOSYS). The tool's arguments
// make the kernel itself answer something else, so EPERM is the
// sandbox's doing.
func TestDangerousSyscallsDenied(t *testing.T) {
	testutil.RequiresRoot(t)
	id := newSandbox(t, client.SandboxSpec{})
	putAttack(t, id)
	want := map[string]string{"io_uring_setup": "ENOSYS"}
	for _, user := range []string{"", "user"} {
		var got map[string]string
		duringAttack(t, func() { attack(t, id, user, &got, "syscalls") })
		if len(got) < 20 {
			t.Fatalf("only %d syscalls tried: %v", len(got), got)
		}
		for name, e := range got {
			w := want[name]
			if w == "" {
				w = "EPERM"
			}
			if e != w {
				t.Errorf("user %q: %s = %s, want %s", user, name, e, w)
			}
		}
	}
	// The same through the image's own tools.
	r := execIn(t, id, client.ExecRequest{Shell: "unshare -U true 2>&1; echo unshare=$?; mount -t tmpfs x /mnt 2>&1; echo mount=$?"})
	if !strings.Contains(r.stdout, "unshare=1") || !strings.Contains(r.stdout, "mount=") || strings.Contains(r.stdout, "mount=0") {
		t.Errorf("unshare/mount from busybox: %q", r.stdout)
	}
	assertHealthy(t)
}

// Overwriting /bin/bash (or busybox, which every applet is) changes only
// the attacker's private layer: a bystander and a fresh sandbox of the
// same image run the original, and the image's files on the host are
// untouched. Also through the file API, which writes with the sandbox's
// view, not the host's.
func TestOverwriteSystemBinaries(t *testing.T) {
	testutil.RequiresRoot(t)
	want := map[string]string{}
	for _, f := range []string{"bin/bash", "bin/busybox"} {
		b, err := os.ReadFile(filepath.Join(suite.rootfs, f))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		want["/"+f] = hex.EncodeToString(sum[:])
	}
	want["/bin/sh"] = want["/bin/busybox"] // a symlink to it
	id := newSandbox(t, client.SandboxSpec{})
	// A non-root agent cannot; root in the sandbox can, in its own layer.
	if r := execIn(t, id, client.ExecRequest{User: "user", Shell: "echo pwned > /bin/bash"}); r.ExitCode == 0 {
		t.Error("user 1000 overwrote /bin/bash")
	}
	// busybox picks the applet by argv[0]: the saved copy keeps the name.
	sh(t, id, `mkdir /tmp/saved && cp /bin/busybox /tmp/saved/busybox
printf '#!/tmp/saved/busybox sh\necho pwned-bash\n' > /bin/bash
/tmp/saved/busybox cp /bin/bash /bin/busybox.new
/tmp/saved/busybox mv /bin/busybox.new /bin/busybox`)
	if out := sh(t, id, "/bin/bash"); out != "pwned-bash\n" {
		t.Fatalf("attacker's /bin/bash: %q", out)
	}
	suite.srv.MustCLI(t, "file", "put", "--mode", "0755", id, suite.attack, "/bin/sh")

	check := func(sb string) {
		t.Helper()
		r := execIn(t, sb, client.ExecRequest{Args: []string{"sha256sum", "/bin/bash", "/bin/busybox", "/bin/sh"}})
		for f, sum := range want {
			if !strings.Contains(r.stdout, sum+"  "+f) {
				t.Errorf("%s: %s is not the image's: %q", sb, f, r.stdout)
			}
		}
		if out := sh(t, sb, "echo 'echo $BASH_VERSION' | /bin/bash"); !strings.HasPrefix(out, "5.") && !strings.HasPrefix(out, "4.") {
			t.Errorf("%s: /bin/bash is not bash: %q", sb, out)
		}
	}
	check(suite.bystander)
	fresh := newSandbox(t, client.SandboxSpec{})
	check(fresh)
	for f, sum := range want {
		b, err := os.ReadFile(filepath.Join(suite.rootfs, f))
		if err != nil {
			t.Fatal(err)
		}
		if s := sha256.Sum256(b); hex.EncodeToString(s[:]) != sum {
			t.Errorf("host copy of %s changed", f)
		}
	}
	assertHealthy(t)
}

// Root in a sandbox keeps CAP_MKNOD (docker's set), so it can make a node
// for any device number: the bystander's loop disk (to read or rewrite
// another sandbox's files raw), the host's serial console, /dev/fuse. The
// sandbox's root and /dev are nodev, so such a node does not open.
func TestDeviceNodes(t *testing.T) {
	testutil.RequiresRoot(t)
	// The bystander's disk on the host; its device numbers.
	out, err := exec.Command("losetup", "-n", "-O", "NAME", "-j", filepath.Join(suite.srv.DataDir, "node", "sandboxes", suite.bystander, "disk.img")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var targets [][3]string // name, type, "major minor"
	if dev := strings.TrimSpace(string(out)); dev != "" {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			t.Fatal(err)
		}
		targets = append(targets, [3]string{"bystander-disk", "b", fmt.Sprintf("%d %d", unix.Major(st.Rdev), unix.Minor(st.Rdev))})
	} else {
		t.Logf("the bystander has no disk of its own (default disk 0): probing loop0 instead")
		targets = append(targets, [3]string{"loop0", "b", "7 0"})
	}
	targets = append(targets,
		[3]string{"console", "c", "4 64"},
		[3]string{"fuse", "c", "10 229"},
		[3]string{"mem", "c", "1 1"},
		[3]string{"nul", "c", "1 3"}, // /dev/null's numbers: opens if anything does
	)
	id := newSandbox(t, client.SandboxSpec{})
	putAttack(t, id)
	var script strings.Builder
	var nodes []string
	for _, dir := range []string{"/root", "/dev", "/workspace"} {
		for _, tg := range targets {
			node := dir + "/" + tg[0]
			nodes = append(nodes, node)
			fmt.Fprintf(&script, "mknod %s %s %s\n", node, tg[1], tg[2])
		}
	}
	sh(t, id, script.String())
	// The tool opens without blocking (a console read would wait).
	var reads map[string]struct {
		Opened bool   `json:"opened"`
		Err    string `json:"err"`
	}
	attack(t, id, "", &reads, append([]string{"read"}, nodes...)...)
	for _, n := range nodes {
		r, ok := reads[n]
		if !ok {
			t.Errorf("%s: not probed", n)
			continue
		}
		if r.Opened {
			t.Errorf("a device node made in the sandbox opened: %s", n)
		}
	}
	// The sandbox's own standard nodes still work.
	if got := sh(t, id, "head -c 3 /dev/zero | wc -c; echo x > /dev/null && echo null-ok"); got != "3\nnull-ok\n" {
		t.Errorf("standard nodes: %q", got)
	}
	assertHealthy(t)
}
