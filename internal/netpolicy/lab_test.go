package netpolicy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"regexp"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/testutil"
)

// The lab: everything a test talks to lives in network namespaces the
// test creates, on addresses it owns. Nothing is ever sent elsewhere: a
// policy-routing safety net sends any packet from the sandbox subnet that
// is not for a lab host, a sandbox or the host itself into a blackhole,
// so even a broken filter cannot leak traffic off the machine.
//
//	sandbox ns --veth (Manager)--> host --veth--> mirror   10.250.1.2
//	                                   \--veth--> internet 10.250.2.2
//	                                    \-veth--> metadata 10.250.3.2 + 169.254.169.254
const (
	labSubnet   = "10.251.0.0/24" // the Manager's sandbox subnet in tests
	mirrorIP    = "10.250.1.2"
	mirrorHost  = "10.250.1.1" // the host's own end of the mirror link
	internetIP  = "10.250.2.2"
	metaLinkIP  = "10.250.3.2"
	metadataIP  = "169.254.169.254"
	labRulePref = 1200
)

type lab struct {
	t      testing.TB
	suffix string // random, keeps names unique per run
	nl     *netlink.Handle
	table  int // policy-routing table of the safety net
}

// newLab builds the test hosts and the safety net; t.Cleanup removes all.
func newLab(t testing.TB) *lab {
	t.Helper()
	testutil.RequiresRoot(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	l := &lab{t: t, suffix: hex.EncodeToString(b[:])}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	l.nl = h
	t.Cleanup(h.Close)
	for _, cidr := range []string{"10.250.0.0/16", labSubnet} {
		if l.routeExists(cidr) {
			t.Fatalf("%s is routed on this host already; the lab needs it for itself", cidr)
		}
	}
	l.table = 4200 + int(b[0])
	l.safetyNet()
	return l
}

func (l *lab) routeExists(cidr string) bool {
	routes, err := l.nl.RouteList(nil, unix.AF_INET)
	if err != nil {
		l.t.Fatal(err)
	}
	p := netip.MustParsePrefix(cidr)
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		if a, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && p.Contains(a) {
			return true
		}
	}
	return false
}

// safetyNet: from the sandbox subnet, lab hosts via the lab table; other
// sandboxes via main without its default route; everything else
// blackholed.
func (l *lab) safetyNet() {
	t := l.t
	src := mustIPNet(labSubnet)
	rules := []*netlink.Rule{}
	r1 := netlink.NewRule()
	r1.Priority, r1.Src, r1.Table = labRulePref, src, l.table
	r2 := netlink.NewRule()
	r2.Priority, r2.Src, r2.Dst, r2.Table, r2.SuppressPrefixlen = labRulePref+1, src, src, unix.RT_TABLE_MAIN, 0
	r3 := netlink.NewRule()
	r3.Priority, r3.Src, r3.Type = labRulePref+2, src, unix.RTN_BLACKHOLE
	rules = append(rules, r1, r2, r3)
	for _, r := range rules {
		if err := l.nl.RuleAdd(r); err != nil {
			t.Fatalf("ip rule add %v: %v", r, err)
		}
		r := r
		t.Cleanup(func() {
			if err := l.nl.RuleDel(r); err != nil {
				t.Errorf("ip rule del %v: %v", r, err)
			}
		})
	}
	t.Cleanup(func() {
		routes, _ := l.nl.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: l.table}, netlink.RT_FILTER_TABLE)
		for _, r := range routes {
			_ = l.nl.RouteDel(&r)
		}
	})
}

func mustIPNet(cidr string) *net.IPNet {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err)
	}
	return n
}

// newNS makes a named network namespace with lo up, the way the runtime
// makes a sandbox's, without moving the calling thread; removed at cleanup.
func (l *lab) newNS(role string) (netns.NsHandle, string) {
	t := l.t
	t.Helper()
	name := "dsect-" + l.suffix + "-" + role
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if err != nil {
		t.Fatalf("new netns %s: %v", name, err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to host netns: %v", err) // the thread stays locked and dies
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return ns, "/run/netns/" + name
}

// inNS runs fn on a thread inside ns; sockets made in fn stay there.
func inNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn() // the host's
	}
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		goruntime.UnlockOSThread()
		return err
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return err // thread stays locked: it dies with the goroutine
	}
	goruntime.UnlockOSThread()
	return ferr
}

// testHost is a namespace behind a host veth, on addresses the lab owns.
type testHost struct {
	name string
	ns   netns.NsHandle
	ip   string
}

// addHost makes a test host at 10.250.n.2/24, the host's end 10.250.n.1;
// extra addresses are put on its interface too and routed to it from the
// sandbox subnet only (lab table).
func (l *lab) addHost(role string, n int, extra ...string) *testHost {
	t := l.t
	t.Helper()
	ns, _ := l.newNS(role)
	hostLink := fmt.Sprintf("dt%s%d", l.suffix, n)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = hostLink
	veth := netlink.NewVeth(attrs)
	veth.PeerName = "eth0"
	veth.PeerNamespace = netlink.NsFd(ns)
	if err := l.nl.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s: %v", hostLink, err)
	}
	t.Cleanup(func() {
		if err := l.nl.LinkDel(veth); err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) && !errors.Is(err, unix.ENODEV) {
				t.Errorf("delete %s: %v", hostLink, err)
			}
		}
	})
	hostAddr := fmt.Sprintf("10.250.%d.1", n)
	ip := fmt.Sprintf("10.250.%d.2", n)
	if err := l.nl.AddrAdd(veth, &netlink.Addr{IPNet: mustCIDR(hostAddr + "/24")}); err != nil {
		t.Fatal(err)
	}
	if err := l.nl.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: mustCIDR(ip + "/24")}); err != nil {
		t.Fatal(err)
	}
	for _, x := range extra {
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: mustCIDR(x + "/32")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{Gw: net.ParseIP(hostAddr), LinkIndex: eth.Attrs().Index}); err != nil {
		t.Fatal(err)
	}
	// Lab table: this host's subnet and extra addresses, for packets
	// from sandboxes.
	if err := l.nl.RouteAdd(&netlink.Route{Table: l.table, Dst: mustIPNet(fmt.Sprintf("10.250.%d.0/24", n)),
		LinkIndex: veth.Index, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	for _, x := range extra {
		if err := l.nl.RouteAdd(&netlink.Route{Table: l.table, Dst: mustCIDR(x + "/32"),
			Gw: net.ParseIP(ip), LinkIndex: veth.Index}); err != nil {
			t.Fatal(err)
		}
	}
	return &testHost{name: role, ns: ns, ip: ip}
}

func mustCIDR(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

// serveTCP listens in ns on addr and greets every connection with banner.
func serveTCP(t testing.TB, ns netns.NsHandle, addr, banner string) {
	t.Helper()
	var ln net.Listener
	if err := inNS(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, banner+"\n")
			c.Close()
		}
	}()
}

// serveUDP answers every datagram on addr with banner.
func serveUDP(t testing.TB, ns netns.NsHandle, addr, banner string) {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(ns, func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err }); err != nil {
		t.Fatalf("listen udp %s: %v", addr, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(banner), from)
		}
	}()
}

// dialTCP connects from ns to addr and returns the banner it sends.
func dialTCP(ns netns.NsHandle, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	err := inNS(ns, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// queryUDP sends one datagram from ns to addr and waits for an answer.
func queryUDP(ns netns.NsHandle, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	if err := inNS(ns, func() (err error) { c, err = net.Dial("udp4", addr); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// linksWithPrefix lists host links whose name starts with prefix.
func linksWithPrefix(t testing.TB, prefix string) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// nsLinks lists the links inside ns.
func nsLinks(t testing.TB, ns netns.NsHandle) []string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	return out
}

func tableExists(t testing.TB, name string) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == name {
			return true
		}
	}
	return false
}

func readIPForward(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(ipForwardPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// hostListeningTCPPorts lists the ports of TCP sockets listening in the
// host namespace (from /proc/net/tcp and tcp6).
func hostListeningTCPPorts(t testing.TB) []int {
	t.Helper()
	seen := map[int]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 4 || fs[3] != "0A" { // 0A = LISTEN
				continue
			}
			_, port, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			var p int
			if _, err := fmt.Sscanf(port, "%X", &p); err == nil {
				seen[p] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	return out
}

// labLeaks lists lab objects still present: namespaces, links, policy
// rules and nftables tables.
func labLeaks() []string {
	var out []string
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "dsect-") {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if labLinkName.MatchString(l.Attrs().Name) {
				out = append(out, "link "+l.Attrs().Name)
			}
		}
	}
	if rules, err := netlink.RuleList(unix.AF_INET); err == nil {
		for _, r := range rules {
			if r.Priority >= labRulePref && r.Priority <= labRulePref+2 {
				out = append(out, fmt.Sprintf("rule %d", r.Priority))
			}
		}
	}
	if c, err := nftables.New(); err == nil {
		if tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet); err == nil {
			for _, tb := range tables {
				if strings.HasPrefix(tb.Name, "dsectest") {
					out = append(out, "table "+tb.Name)
				}
			}
		}
	}
	return out
}

var labLinkName = regexp.MustCompile(`^d[tq][0-9a-f]{4,}`)
