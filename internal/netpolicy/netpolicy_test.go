package netpolicy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

const (
	okTimeout   = 2 * time.Second
	failTimeout = 400 * time.Millisecond
	// Host listeners the tests start on the host's end of the mirror
	// link: one the operator excepts, one not.
	hostExceptedPort = 7001
	hostClosedPort   = 7002
)

// labManager returns a Manager on the lab's own subnet, prefix and table,
// closed at cleanup.
func labManager(t testing.TB, l *lab, mutate func(*Config)) (*Manager, Config) {
	t.Helper()
	cfg := Config{
		Subnet:     netip.MustParsePrefix(labSubnet),
		LinkPrefix: "dq" + l.suffix[:4],
		Table:      "dsectest" + l.suffix,
		Presets: map[string][]node.NetworkRule{
			"mirror": {{CIDR: mirrorIP, Ports: "8080,9090", Protocol: "tcp"}, {CIDR: mirrorIP, Ports: "5353", Protocol: "udp"}},
			"npm":    {{CIDR: internetIP, Ports: "8080", Protocol: "tcp"}},
		},
		Exceptions: []node.NetworkRule{
			{CIDR: mirrorHost, Ports: fmt.Sprint(hostExceptedPort), Protocol: "tcp"},
			{CIDR: metadataIP, Ports: "81", Protocol: "tcp"},
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m, cfg
}

func mustReach(t *testing.T, ns netns.NsHandle, addr, want string) {
	t.Helper()
	got, err := dialTCP(ns, addr, okTimeout)
	if err != nil || got != want {
		t.Fatalf("tcp %s: got %q, %v; want %q", addr, got, err, want)
	}
}

func mustNotReach(t *testing.T, ns netns.NsHandle, addr string) {
	t.Helper()
	if got, err := dialTCP(ns, addr, failTimeout); err == nil {
		t.Fatalf("tcp %s answered %q; want no connection", addr, got)
	}
}

func TestEgressPolicy(t *testing.T) {
	l := newLab(t)
	mirror := l.addHost("mirror", 1)
	internet := l.addHost("internet", 2)
	meta := l.addHost("meta", 3, metadataIP)
	serveTCP(t, mirror.ns, mirrorIP+":8080", "mirror")
	serveTCP(t, mirror.ns, mirrorIP+":9090", "mirror-9090")
	serveUDP(t, mirror.ns, mirrorIP+":5353", "mirror-udp")
	serveTCP(t, internet.ns, internetIP+":8080", "internet")
	serveTCP(t, meta.ns, metadataIP+":80", "metadata")
	serveTCP(t, meta.ns, metadataIP+":81", "metadata-81")
	serveTCP(t, meta.ns, metaLinkIP+":80", "meta-link")
	// Host sockets on an address the lab owns, all interfaces.
	serveTCP(t, netns.None(), fmt.Sprintf("%s:%d", mirrorHost, hostExceptedPort), "host-excepted")
	serveTCP(t, netns.None(), fmt.Sprintf("%s:%d", mirrorHost, hostClosedPort), "host-closed")
	serveUDP(t, netns.None(), mirrorHost+":7003", "host-udp")

	// A control: the host itself reaches every lab host, so a failure
	// below is the policy's doing.
	for addr, want := range map[string]string{mirrorIP + ":8080": "mirror", internetIP + ":8080": "internet", metaLinkIP + ":80": "meta-link"} {
		if got, err := dialTCP(netns.None(), addr, okTimeout); err != nil || got != want {
			t.Fatalf("lab broken: host to %s: %q, %v", addr, got, err)
		}
	}

	m, cfg := labManager(t, l, nil)
	sbx, sbxPath := l.newNS("sbxa")
	ctx := context.Background()

	t.Run("default loopback only", func(t *testing.T) {
		// Apply with a policy that allows nothing is free: no link.
		if err := m.Apply(ctx, "sbx-a", sbxPath, node.NetworkPolicy{}); err != nil {
			t.Fatal(err)
		}
		if got := nsLinks(t, sbx); !slices.Equal(got, []string{"lo"}) {
			t.Fatalf("sandbox links = %v, want [lo]", got)
		}
		if tableExists(t, cfg.Table) {
			t.Fatal("table installed although no sandbox has a network")
		}
		for _, a := range []string{mirrorIP + ":8080", internetIP + ":8080", mirrorHost + ":7001"} {
			mustNotReach(t, sbx, a)
		}
	})

	t.Run("allow one endpoint", func(t *testing.T) {
		p := node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: mirrorIP, Ports: "8080", Protocol: "tcp"}}}
		if err := m.Apply(ctx, "sbx-a", sbxPath, p); err != nil {
			t.Fatal(err)
		}
		if got := readIPForward(t); got != "1" {
			t.Fatalf("ip_forward = %s after Attach, want 1", got)
		}
		mustReach(t, sbx, mirrorIP+":8080", "mirror")
		mustNotReach(t, sbx, mirrorIP+":9090")
		mustNotReach(t, sbx, internetIP+":8080")
		if got, err := queryUDP(sbx, mirrorIP+":5353", failTimeout); err == nil {
			t.Fatalf("udp to mirror answered %q, not allowed", got)
		}
	})

	t.Run("preset", func(t *testing.T) {
		p := node.NetworkPolicy{Allow: []node.NetworkRule{{Preset: "mirror"}}}
		if err := m.Update(ctx, "sbx-a", p); err != nil {
			t.Fatal(err)
		}
		mustReach(t, sbx, mirrorIP+":8080", "mirror")
		mustReach(t, sbx, mirrorIP+":9090", "mirror-9090")
		if got, err := queryUDP(sbx, mirrorIP+":5353", okTimeout); err != nil || got != "mirror-udp" {
			t.Fatalf("udp to mirror via preset: %q, %v", got, err)
		}
		mustNotReach(t, sbx, internetIP+":8080")
	})

	t.Run("deny overrides allow", func(t *testing.T) {
		p := node.NetworkPolicy{
			Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}},
			Deny:  []node.NetworkRule{{Preset: "npm"}, {CIDR: mirrorIP, Ports: "9090"}},
		}
		if err := m.Update(ctx, "sbx-a", p); err != nil {
			t.Fatal(err)
		}
		mustReach(t, sbx, mirrorIP+":8080", "mirror")
		mustNotReach(t, sbx, mirrorIP+":9090")
		mustNotReach(t, sbx, internetIP+":8080")
	})

	t.Run("protected even with allow all", func(t *testing.T) {
		// Another sandbox with a listener on its own address.
		sbxB, sbxBPath := l.newNS("sbxb")
		if err := m.Attach(ctx, "sbx-b", sbxBPath, node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}); err != nil {
			t.Fatal(err)
		}
		addrB, ok := m.Address("sbx-b")
		if !ok {
			t.Fatal("sbx-b has no address")
		}
		serveTCP(t, sbxB, addrB.String()+":8080", "sandbox-b")

		if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}); err != nil {
			t.Fatal(err)
		}
		addrA, _ := m.Address("sbx-a")
		mustReach(t, sbx, internetIP+":8080", "internet")
		mustReach(t, sbx, metaLinkIP+":80", "meta-link")
		for _, a := range []string{
			metadataIP + ":80",                               // link-local metadata
			addrB.String() + ":8080",                         // another sandbox
			fmt.Sprintf("%s:%d", mirrorHost, hostClosedPort), // host socket
			m.cfg.gateway.String() + ":80",                   // the sandboxes' gateway
		} {
			mustNotReach(t, sbx, a)
		}
		if got, err := queryUDP(sbx, mirrorHost+":7003", failTimeout); err == nil {
			t.Fatalf("host udp answered %q", got)
		}
		// Nor can B open a connection to A, though B allows all and A
		// listens on its address.
		serveTCP(t, sbx, addrA.String()+":8081", "sandbox-a")
		mustNotReach(t, sbxB, addrA.String()+":8081")
		// Loopback inside the sandbox is the sandbox's own.
		serveTCP(t, sbx, "127.0.0.1:7002", "own-loopback")
		mustReach(t, sbx, "127.0.0.1:7002", "own-loopback")

		// Operator exceptions open exactly what they name, and the paths
		// above were blocked by policy, not broken.
		mustReach(t, sbx, metadataIP+":81", "metadata-81")
		mustReach(t, sbx, fmt.Sprintf("%s:%d", mirrorHost, hostExceptedPort), "host-excepted")
		// An exception is not an allow: without a rule of its own the
		// sandbox still cannot reach it.
		if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP}}}); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, sbx, metadataIP+":81")
		mustNotReach(t, sbx, fmt.Sprintf("%s:%d", mirrorHost, hostExceptedPort))

		if err := m.Detach(ctx, "sbx-b"); err != nil {
			t.Fatal(err)
		}
		if got := nsLinks(t, sbxB); !slices.Equal(got, []string{"lo"}) {
			t.Fatalf("sandbox b links after Detach = %v", got)
		}
	})

	t.Run("host port scan finds nothing", func(t *testing.T) {
		if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}); err != nil {
			t.Fatal(err)
		}
		ports := hostListeningTCPPorts(t)
		for p := 1; p <= 1024; p++ {
			ports = append(ports, p)
		}
		var open []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		// Every port 1-1024 and every port the host listens on, at the
		// host's address and at the gateway; the listening ports at the
		// host's other lab addresses.
		targets := map[string][]int{mirrorHost: ports, m.cfg.gateway.String(): ports,
			"10.250.2.1": hostListeningTCPPorts(t), "10.250.3.1": hostListeningTCPPorts(t)}
		for host, ports := range targets {
			for _, p := range ports {
				if host == mirrorHost && p == hostExceptedPort {
					continue // the operator's exception
				}
				wg.Add(1)
				sem <- struct{}{}
				go func(addr string) {
					defer wg.Done()
					defer func() { <-sem }()
					if _, err := dialTCP(sbx, addr, 200*time.Millisecond); err == nil {
						mu.Lock()
						open = append(open, addr)
						mu.Unlock()
					}
				}(net.JoinHostPort(host, fmt.Sprint(p)))
			}
		}
		wg.Wait()
		if len(open) > 0 {
			t.Fatalf("host ports reachable from the sandbox: %v", open)
		}
		// The scan covered ports the host really listens on.
		if !slices.Contains(hostListeningTCPPorts(t), hostClosedPort) {
			t.Fatal("host listener missing from the scan")
		}
	})

	t.Run("update applies to the next connection", func(t *testing.T) {
		linkBefore := nsLinkIndex(t, sbx)
		allowNet := node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP, Ports: "8080", Protocol: "tcp"}}}
		for i := range 3 {
			if err := m.Update(ctx, "sbx-a", allowNet); err != nil {
				t.Fatal(err)
			}
			mustReach(t, sbx, internetIP+":8080", "internet")
			if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{}); err != nil {
				t.Fatal(err)
			}
			mustNotReach(t, sbx, internetIP+":8080")
			_ = i
		}
		if got := nsLinkIndex(t, sbx); got != linkBefore {
			t.Fatalf("sandbox link changed (%d -> %d): Update must not re-plumb", linkBefore, got)
		}
	})

	t.Run("errors", func(t *testing.T) {
		if err := m.Attach(ctx, "sbx-a", sbxPath, node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}); !errdefs.IsAlreadyExists(err) {
			t.Fatalf("second Attach: %v, want already exists", err)
		}
		if err := m.Update(ctx, "nope", node.NetworkPolicy{}); !errdefs.IsNotFound(err) {
			t.Fatalf("Update unknown: %v, want not found", err)
		}
		if err := m.Detach(ctx, "nope"); err != nil {
			t.Fatalf("Detach unknown: %v", err)
		}
		before := linksWithPrefix(t, cfg.LinkPrefix)
		cases := []struct {
			name, path string
			p          node.NetworkPolicy
			is         func(error) bool
		}{
			{"unknown preset", sbxPath, node.NetworkPolicy{Allow: []node.NetworkRule{{Preset: "pypi"}}}, errdefs.IsInvalidArgument},
			{"bad cidr", sbxPath, node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "10.0.0.1/8"}}}, errdefs.IsInvalidArgument},
			{"host netns", fmt.Sprintf("/proc/%d/ns/net", unix.Getpid()), node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}, errdefs.IsInvalidArgument},
			{"missing netns", "/run/netns/dsect-does-not-exist", node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}, errdefs.IsNotFound},
		}
		for _, c := range cases {
			if err := m.Attach(ctx, "sbx-err", c.path, c.p); !c.is(err) {
				t.Errorf("%s: %v", c.name, err)
			}
		}
		// A bad Update leaves the old policy in force.
		if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP}}}); err != nil {
			t.Fatal(err)
		}
		if err := m.Update(ctx, "sbx-a", node.NetworkPolicy{Allow: []node.NetworkRule{{Ports: "0"}}}); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("bad Update: %v", err)
		}
		mustReach(t, sbx, internetIP+":8080", "internet")
		if after := linksWithPrefix(t, cfg.LinkPrefix); !slices.Equal(before, after) {
			t.Fatalf("failed Attach left links: %v -> %v", before, after)
		}
		if _, ok := m.Address("sbx-err"); ok {
			t.Fatal("failed Attach left an address allocated")
		}
	})

	t.Run("detach and close leave nothing", func(t *testing.T) {
		if err := m.Detach(ctx, "sbx-a"); err != nil {
			t.Fatal(err)
		}
		if got := nsLinks(t, sbx); !slices.Equal(got, []string{"lo"}) {
			t.Fatalf("sandbox links after Detach = %v", got)
		}
		mustNotReach(t, sbx, internetIP+":8080")
		if got := linksWithPrefix(t, cfg.LinkPrefix); len(got) != 0 {
			t.Fatalf("host links left after Detach: %v", got)
		}
		if !tableExists(t, cfg.Table) {
			t.Fatal("table gone before Close")
		}
		if err := m.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if tableExists(t, cfg.Table) {
			t.Fatal("table left after Close")
		}
		checkForwardRestored(t)
		if err := m.Attach(ctx, "sbx-a", sbxPath, node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP}}}); !errdefs.IsUnavailable(err) {
			t.Fatalf("Attach after Close: %v", err)
		}
	})
}

func nsLinkIndex(t *testing.T, ns netns.NsHandle) int {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(DefaultGuestLink)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// A server process that dies leaves its table (with the ip_forward marker)
// and sandbox links; the next Manager takes over cleanly.
func TestRecoverAfterCrash(t *testing.T) {
	l := newLab(t)
	internet := l.addHost("internet", 2)
	serveTCP(t, internet.ns, internetIP+":8080", "internet")
	sbx, sbxPath := l.newNS("sbx")
	p := node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP}}}
	ctx := context.Background()

	crashed, cfg := labManager(t, l, nil)
	if err := crashed.Attach(ctx, "sbx", sbxPath, p); err != nil {
		t.Fatal(err)
	}
	mustReach(t, sbx, internetIP+":8080", "internet")
	// "Crash": drop the Manager without Close. Cleanup still closes it at
	// the end, after the successor is gone.
	next, err := NewManager(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Attach(ctx, "other", sbxPath+"-missing", p); !errdefs.IsNotFound(err) {
		t.Fatalf("attach to a missing netns: %v", err)
	}
	// The successor's table replaced the old one: the stale link is
	// rejected (fail closed) until the sandbox is attached again.
	mustNotReach(t, sbx, internetIP+":8080")
	if err := next.Attach(ctx, "sbx", sbxPath, p); err != nil {
		t.Fatalf("re-attach after crash: %v", err)
	}
	mustReach(t, sbx, internetIP+":8080", "internet")
	if got := linksWithPrefix(t, cfg.LinkPrefix); len(got) != 1 {
		t.Fatalf("links after re-attach = %v, want one", got)
	}
	if err := next.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkForwardRestored(t)
	if tableExists(t, cfg.Table) || len(linksWithPrefix(t, cfg.LinkPrefix)) != 0 {
		t.Fatal("table or links left")
	}
}

// Nothing outlives the tests: no namespaces, links, rules or tables of
// theirs.
// hostForward is the host's own ip_forward setting, read before any test:
// "0" if a dsec Manager (another package's server, say) had switched it on.
var hostForward string

// forwardProblem says what is wrong with ip_forward now, if anything: with
// no marked table left it is the host's own setting again; while another
// Manager's marked table exists it must stay on.
func forwardProblem() string {
	b, err := os.ReadFile(ipForwardPath)
	if err != nil {
		return err.Error()
	}
	got := strings.TrimSpace(string(b))
	c, err := nftables.New()
	if err != nil {
		return err.Error()
	}
	if others := markerTables(c, ""); len(others) > 0 {
		if got != "1" {
			return fmt.Sprintf("ip_forward = %s while Managers %v need it on", got, others)
		}
		return ""
	}
	if got != hostForward {
		return fmt.Sprintf("ip_forward = %s, the host's own setting was %s", got, hostForward)
	}
	return ""
}

func checkForwardRestored(t testing.TB) {
	t.Helper()
	if p := forwardProblem(); p != "" {
		t.Fatal(p)
	}
}

func TestMain(m *testing.M) {
	if unix.Geteuid() == 0 {
		b, _ := os.ReadFile(ipForwardPath)
		hostForward = strings.TrimSpace(string(b))
		if c, err := nftables.New(); err == nil && len(markerTables(c, "")) > 0 {
			hostForward = "0"
		}
	}
	code := m.Run()
	if unix.Geteuid() == 0 {
		leaks := labLeaks()
		if p := forwardProblem(); p != "" {
			leaks = append(leaks, p)
		}
		if len(leaks) > 0 {
			fmt.Println("netpolicy tests leaked:", leaks)
			code = 1
		}
	}
	os.Exit(code)
}

// Sandboxes attached and detached at the same time get distinct addresses
// and working, independent policies.
func TestConcurrentAttach(t *testing.T) {
	l := newLab(t)
	internet := l.addHost("internet", 2)
	serveTCP(t, internet.ns, internetIP+":8080", "internet")
	m, cfg := labManager(t, l, nil)
	ctx := context.Background()
	const n = 6
	nss := make([]netns.NsHandle, n)
	paths := make([]string, n)
	for i := range n {
		nss[i], paths[i] = l.newNS(fmt.Sprintf("c%d", i))
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := node.NetworkPolicy{} // odd ones get nothing but a link
			if i%2 == 0 {
				p.Allow = []node.NetworkRule{{CIDR: internetIP, Ports: "8080", Protocol: "tcp"}}
			}
			errs[i] = m.Attach(ctx, fmt.Sprintf("c%d", i), paths[i], p)
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("attach c%d: %v", i, errs[i])
		}
		a, ok := m.Address(fmt.Sprintf("c%d", i))
		if !ok || seen[a] || !m.Subnet().Contains(a) {
			t.Fatalf("c%d: address %v (ok %v) duplicate or outside the subnet", i, a, ok)
		}
		seen[a] = true
	}
	for i := range n {
		if i%2 == 0 {
			mustReach(t, nss[i], internetIP+":8080", "internet")
		} else {
			mustNotReach(t, nss[i], internetIP+":8080")
		}
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Detach(ctx, fmt.Sprintf("c%d", i))
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("detach c%d: %v", i, errs[i])
		}
	}
	if got := linksWithPrefix(t, cfg.LinkPrefix); len(got) != 0 {
		t.Fatalf("links left: %v", got)
	}
}

// A full subnet says so, and an address comes back after Detach.
func TestSubnetExhausted(t *testing.T) {
	l := newLab(t)
	m, _ := labManager(t, l, func(c *Config) { c.Subnet = netip.MustParsePrefix("10.251.0.0/29") })
	ctx := context.Background()
	p := node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: internetIP}}}
	// /29: network, gateway, broadcast taken; five sandboxes fit.
	for i := range 5 {
		_, path := l.newNS(fmt.Sprintf("x%d", i))
		if err := m.Attach(ctx, fmt.Sprintf("x%d", i), path, p); err != nil {
			t.Fatalf("attach x%d: %v", i, err)
		}
	}
	_, path := l.newNS("x5")
	if err := m.Attach(ctx, "x5", path, p); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("sixth Attach: %v, want resource exhausted", err)
	}
	if err := m.Detach(ctx, "x2"); err != nil {
		t.Fatal(err)
	}
	if err := m.Attach(ctx, "x5", path, p); err != nil {
		t.Fatalf("Attach after a Detach: %v", err)
	}
	if a, _ := m.Address("x5"); a != netip.MustParseAddr("10.251.0.4") {
		t.Fatalf("x5 got %s, want the freed 10.251.0.4", a)
	}
}

// Two Managers on one host (each its table, subnet and prefix) do not get
// in each other's way, and ip_forward goes back only after the last.
func TestTwoManagers(t *testing.T) {
	l := newLab(t)
	internet := l.addHost("internet", 2)
	serveTCP(t, internet.ns, internetIP+":8080", "internet")
	ctx := context.Background()
	a, _ := labManager(t, l, func(c *Config) { c.Subnet = netip.MustParsePrefix("10.251.0.0/25") })
	b, _ := labManager(t, l, func(c *Config) {
		c.Subnet = netip.MustParsePrefix("10.251.0.128/25")
		c.LinkPrefix = "dq" + l.suffix[2:6]
		c.Table += "b"
	})
	allowAll := node.NetworkPolicy{Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}}}
	nsA, pathA := l.newNS("ma")
	nsB, pathB := l.newNS("mb")
	if err := a.Attach(ctx, "a", pathA, allowAll); err != nil {
		t.Fatal(err)
	}
	if err := b.Attach(ctx, "b", pathB, allowAll); err != nil {
		t.Fatal(err)
	}
	mustReach(t, nsA, internetIP+":8080", "internet")
	mustReach(t, nsB, internetIP+":8080", "internet")
	// B's policy allows all and A's subnet is not in B's protected set;
	// A's table still refuses connections into its sandboxes.
	addrA, _ := a.Address("a")
	serveTCP(t, nsA, addrA.String()+":8081", "sandbox-a")
	mustNotReach(t, nsB, addrA.String()+":8081")

	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readIPForward(t); got != "1" {
		t.Fatalf("ip_forward = %s after the first Close; the other Manager needs it", got)
	}
	mustReach(t, nsB, internetIP+":8080", "internet")
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkForwardRestored(t)
}
