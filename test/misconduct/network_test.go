package misconduct

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/testutil"
	"golang.org/x/sys/unix"
)

// testHost is a network namespace the test creates and owns, reached from
// the host over a veth pair: a stand-in for a package mirror (allowed) and,
// on the same namespace, a metadata service at 169.254.169.254 (never
// allowed). Only these addresses, the host's own and the sandboxes' ever
// receive a packet.
type testHost struct {
	addr     string // the mirror's address
	hostSide string // the host end's address
	port     int    // every listener's port
}

const metadataAddr = "169.254.169.254"

func newTestHost(t *testing.T) *testHost {
	t.Helper()
	suffix := strconv.Itoa(os.Getpid() % 100000)
	ns, hostLink, nsLink := "msc-h"+suffix, "msch"+suffix, "mscn"+suffix
	h := &testHost{addr: "10.218.7.2", hostSide: "10.218.7.1", port: 8080}
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "route", "del", metadataAddr+"/32").Run()
		_ = exec.Command("ip", "link", "del", hostLink).Run()
		_ = exec.Command("ip", "netns", "del", ns).Run()
	})
	ipCmd("netns", "add", ns)
	ipCmd("link", "add", hostLink, "type", "veth", "peer", "name", nsLink)
	ipCmd("link", "set", nsLink, "netns", ns)
	ipCmd("addr", "add", h.hostSide+"/30", "dev", hostLink)
	ipCmd("link", "set", hostLink, "up")
	ipCmd("-n", ns, "addr", "add", h.addr+"/30", "dev", nsLink)
	ipCmd("-n", ns, "addr", "add", metadataAddr+"/32", "dev", nsLink)
	ipCmd("-n", ns, "link", "set", nsLink, "up")
	ipCmd("-n", ns, "link", "set", "lo", "up")
	ipCmd("route", "add", metadataAddr+"/32", "via", h.addr)

	// The listener lives in the namespace: a thread enters it, listens,
	// and is thrown away (never unlocked) so no goroutine runs there after.
	lc := make(chan net.Listener, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		l, err := net.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", h.port))
		if err != nil {
			errc <- err
			return
		}
		lc <- l
	}()
	select {
	case err := <-errc:
		t.Fatal(err)
	case l := <-lc:
		t.Cleanup(func() { l.Close() })
		go serveHello(l)
	}
	// The host reaches both: the addresses are real, so a failure from a
	// sandbox is the policy's doing.
	for _, a := range []string{h.addr, metadataAddr} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(a, strconv.Itoa(h.port)), 2*time.Second)
		if err != nil {
			t.Fatalf("test host %s not reachable from the host: %v", a, err)
		}
		c.Close()
	}
	return h
}

func serveHello(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte("hello\n"))
		c.Close()
	}
}

type scanResult struct {
	Open   []string          `json:"open"`
	Closed map[string]string `json:"closed"`
}

func scanFrom(t *testing.T, id string, targets ...string) scanResult {
	t.Helper()
	var r scanResult
	attack(t, id, "user", &r, append([]string{"scan"}, targets...)...)
	return r
}

// hostAddrs are the host's own IPv4 addresses, loopback included.
func hostAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

func sandboxAddr(t *testing.T, id string) string {
	t.Helper()
	out := sh(t, id, "ip -4 -o addr show dev eth0")
	f := strings.Fields(out)
	for i, w := range f {
		if w == "inet" && i+1 < len(f) {
			return strings.Split(f[i+1], "/")[0]
		}
	}
	t.Fatalf("no IPv4 address on eth0: %q", out)
	return ""
}

// Port scans: a sandbox with the default policy reaches nothing but its
// own loopback. One allowed everything (0.0.0.0/0) reaches the test's
// mirror, but still not the host (any of its addresses: the dsec API, a
// host service), the metadata address, or another sandbox; and a policy
// replaced at run time applies to the next connection.
func TestPortScan(t *testing.T) {
	testutil.RequiresRoot(t)
	th := newTestHost(t)
	hostL, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostL.Close() })
	go serveHello(hostL)
	hostPort := strconv.Itoa(hostL.Addr().(*net.TCPAddr).Port)
	_, apiPort, _ := net.SplitHostPort(suite.srv.TCPAddr)
	mirror := net.JoinHostPort(th.addr, strconv.Itoa(th.port))

	// A bystander with egress (so it has an address) serving on port 9000.
	by := newSandbox(t, client.SandboxSpec{Network: client.NetworkPolicy{Allow: []client.NetworkRule{{CIDR: th.addr + "/32"}}}})
	sh(t, by, "httpd -p 0.0.0.0:9000 -h /workspace")
	byAddr := sandboxAddr(t, by)
	if r := scanFromAttackTool(t, by, "127.0.0.1:9000"); len(r.Open) != 1 {
		t.Fatalf("bystander's own server not up: %+v", r)
	}

	forbidden := []string{
		net.JoinHostPort(metadataAddr, strconv.Itoa(th.port)),
		net.JoinHostPort(metadataAddr, "80"),
		net.JoinHostPort(th.hostSide, hostPort),
		net.JoinHostPort(byAddr, "9000"),
		"127.0.0.1:" + apiPort, // the sandbox's own loopback: nothing there
	}
	// Every host address on the ports that matter; one of them on every
	// low port (rejections are ICMP, which the kernel rate-limits, so a
	// full scan of each address would mostly measure the rate limit).
	scanned := false
	for _, a := range hostAddrs(t) {
		forbidden = append(forbidden, net.JoinHostPort(a, hostPort), net.JoinHostPort(a, apiPort), net.JoinHostPort(a, "22"))
		if !scanned && a != "127.0.0.1" {
			forbidden = append(forbidden, net.JoinHostPort(a, "1-1024"))
			scanned = true
		}
	}

	t.Run("default policy", func(t *testing.T) {
		id := newSandbox(t, client.SandboxSpec{})
		putAttack(t, id)
		sh(t, id, "httpd -p 127.0.0.1:7777 -h /workspace")
		var r scanResult
		duringAttack(t, func() {
			r = scanFrom(t, id, append([]string{"127.0.0.1:7777", mirror}, forbidden...)...)
		})
		if len(r.Open) != 1 || r.Open[0] != "127.0.0.1:7777" {
			t.Errorf("open from a loopback-only sandbox: %v, want only its own 127.0.0.1:7777", r.Open)
		}
		if out := sh(t, id, "ip -o link | wc -l"); strings.TrimSpace(out) != "1" {
			t.Errorf("default sandbox has links besides lo: %s", out)
		}
	})

	t.Run("allow everything", func(t *testing.T) {
		id := newSandbox(t, client.SandboxSpec{Network: client.NetworkPolicy{Allow: []client.NetworkRule{{CIDR: "0.0.0.0/0"}}}})
		putAttack(t, id)
		var r scanResult
		start := time.Now()
		duringAttack(t, func() { r = scanFrom(t, id, append([]string{mirror}, forbidden...)...) })
		t.Logf("scan of %d targets took %v; why closed (one example each): %v", len(forbidden)+1, time.Since(start), r.Closed)
		if len(r.Open) != 1 || r.Open[0] != mirror {
			t.Errorf("open with allow 0.0.0.0/0: %v, want only the mirror %s", r.Open, mirror)
		}

		// Replaced at run time: the mirror's port is no longer allowed.
		c := admin(t)
		if err := c.SetNetwork(ctxT(t, 30*time.Second), id, client.NetworkPolicy{Allow: []client.NetworkRule{{CIDR: th.addr + "/32", Ports: "9999", Protocol: "tcp"}}}); err != nil {
			t.Fatal(err)
		}
		if r := scanFrom(t, id, mirror); len(r.Open) != 0 {
			t.Errorf("after narrowing the policy the mirror is still open: %v", r.Open)
		}
		if err := c.SetNetwork(ctxT(t, 30*time.Second), id, client.NetworkPolicy{Allow: []client.NetworkRule{{CIDR: th.addr + "/32", Ports: strconv.Itoa(th.port)}}}); err != nil {
			t.Fatal(err)
		}
		if r := scanFrom(t, id, mirror, net.JoinHostPort(metadataAddr, strconv.Itoa(th.port))); len(r.Open) != 1 || r.Open[0] != mirror {
			t.Errorf("after re-allowing the mirror: open %v", r.Open)
		}
		// Rules naming protected destinations still do not reach them.
		// Refusing such rules outright would do too.
		err := c.SetNetwork(ctxT(t, 30*time.Second), id, client.NetworkPolicy{Allow: []client.NetworkRule{{CIDR: "169.254.0.0/16"}, {CIDR: th.hostSide + "/32"}, {CIDR: byAddr + "/32"}}})
		if err != nil && !client.IsInvalidArgument(err) {
			t.Fatal(err)
		}
		if r := scanFrom(t, id, forbidden...); len(r.Open) != 0 {
			t.Errorf("protected destinations reachable when named by allow rules: %v", r.Open)
		}
	})
	assertHealthy(t)
}

// scanFromAttackTool copies the tool in first (for sandboxes that do not
// have it yet) and scans as root.
func scanFromAttackTool(t *testing.T, id string, targets ...string) scanResult {
	t.Helper()
	putAttack(t, id)
	var r scanResult
	attack(t, id, "", &r, append([]string{"scan"}, targets...)...)
	return r
}
