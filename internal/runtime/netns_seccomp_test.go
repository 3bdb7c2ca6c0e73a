package runtime_test

import (
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/runtime"
	"github.com/dsec-dev/dsec/internal/runtime/runtimetest"
	"github.com/dsec-dev/dsec/internal/seccomp"
)

func TestJoinPreparedNetNS(t *testing.T) {
	e := newEnv(t)
	name := runtimetest.RandomName("dsect-")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1").CombinedOutput(); err != nil {
		t.Fatalf("add veth: %v %s", err, out)
	}
	e.create("netns1", func(s *runtime.Spec) { s.NetNSPath = "/run/netns/" + name })
	out := e.mustSh("netns1", "ip -o link | awk '{print $2}' | tr '\\n' ' '")
	if out != "lo: probe1@probe0: probe0@probe1: " && out != "lo: probe0@probe1: probe1@probe0: " {
		t.Fatalf("links in sandbox: %q", out)
	}
	// lo was brought up in the joined namespace.
	b, err := exec.Command("ip", "-n", name, "-o", "link", "show", "lo").CombinedOutput()
	if err != nil || !strings.Contains(string(b), "UP") {
		t.Fatalf("lo in joined netns: %s %v", b, err)
	}
}

// denyMkdir is a tiny seccomp program: mkdir and mkdirat fail with EPERM.
func denyMkdir(runtime.Spec) ([]unix.SockFilter, error) {
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_MKDIR, SkipTrue: 2},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_MKDIRAT, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
	})
	if err != nil {
		return nil, err
	}
	out := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		out[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	return out, nil
}

func TestSeccompFilter(t *testing.T) {
	e := newEnv(t, runtime.WithSeccomp(denyMkdir))
	e.create("sec1")
	if out := e.sh("sec1", "mkdir /tmp/x 2>&1; grep Seccomp: /proc/self/status; grep Seccomp: /proc/1/status").stdout; !strings.Contains(out, "Operation not permitted") ||
		!strings.Contains(out, "Seccomp:\t2\nSeccomp:\t2\n") {
		t.Fatalf("%q", out)
	}
	// Other calls work.
	e.mustSh("sec1", "echo x > /tmp/y && cat /tmp/y")
}

// TestDefaultSeccompProfile runs a sandbox under the project's real
// profile: ordinary work succeeds, user namespaces are refused unless the
// spec allows them.
func TestDefaultSeccompProfile(t *testing.T) {
	e := newEnv(t, runtime.WithSeccomp(func(s runtime.Spec) ([]unix.SockFilter, error) {
		return seccomp.DefaultFilter(seccomp.Options{AllowUserNS: s.AllowUserNS})
	}))
	e.create("prof1")
	e.create("prof2", func(s *runtime.Spec) { s.AllowUserNS = true })
	out := e.mustSh("prof1", "mkdir -p /tmp/a/b && echo x > /tmp/a/b/f && cat /tmp/a/b/f && ps -o comm | grep -c init && sleep 0.01 && date +%Y >/dev/null && echo ok")
	if out != "x\n1\nok\n" {
		t.Fatalf("%q", out)
	}
	if r := e.sh("prof1", "unshare -U true 2>&1"); r.ExitCode == 0 {
		t.Fatalf("user namespace allowed: %q", r.stdout)
	}
	if r := e.sh("prof2", "unshare -U true 2>&1"); r.ExitCode != 0 {
		t.Fatalf("user namespace refused although allowed: %q", r.stdout)
	}
}
