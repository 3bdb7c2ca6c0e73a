package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// macs derives both ends' MAC addresses from the sandbox address
// (locally administered, unicast), so the permanent neighbour entries need
// no lookup and a link is recognisable in a packet capture.
func macs(a netip.Addr) (host, guest net.HardwareAddr) {
	b := a.As4()
	return net.HardwareAddr{0x02, 0xd5, b[0], b[1], b[2], b[3]},
		net.HardwareAddr{0x06, 0xd5, b[0], b[1], b[2], b[3]}
}

// plumb creates the veth pair with its peer directly inside the sandbox's
// namespace, then addresses and routes both ends. On error nothing is
// left behind.
func (m *Manager) plumb(ctx context.Context, a *attachment, netnsPath string) error {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("netpolicy: sandbox %s: network namespace %s: %w", a.id, netnsPath, errdefs.ErrNotFound)
		}
		return fmt.Errorf("netpolicy: sandbox %s: network namespace %s: %v: %w", a.id, netnsPath, err, errdefs.ErrInvalidArgument)
	}
	defer ns.Close()
	if ns.Equal(m.hostNS) {
		return invalidf("sandbox %s: %s is the host's own network namespace", a.id, netnsPath)
	}
	gh, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: netlink in its namespace: %w", a.id, err)
	}
	defer gh.Close()

	hostMAC, guestMAC := macs(a.addr)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = a.link
	attrs.MTU = m.cfg.MTU
	attrs.HardwareAddr = hostMAC
	attrs.Flags = net.FlagUp
	attrs.Group = LinkGroup
	veth := netlink.NewVeth(attrs)
	veth.PeerName = m.cfg.GuestLink
	veth.PeerHardwareAddr = guestMAC
	veth.PeerNamespace = netlink.NsFd(ns)

	err = m.nl.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		// Left over from a server process that died: the host end's name
		// is ours (we own the prefix and did not allocate it), the guest
		// end is a veth in a sandbox namespace that is not the host's.
		m.removeStale(gh, a)
		veth.Index = 0
		err = m.nl.LinkAdd(veth)
	}
	if err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: create veth %s: %w", a.id, a.link, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = m.nl.LinkDel(veth) // takes the peer with it
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	// The kernel ignores an alias given at creation. It names the sandbox
	// for operators (ip link) and guards unplumb.
	if err := m.nl.LinkSetAlias(veth, a.id); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: alias: %w", a.id, err)
	}
	// The host end needs no address; no IPv6 chatter on it either.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+a.link+"/disable_ipv6", []byte("1\n"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netpolicy: sandbox %s: %w", a.id, err)
	}
	host32 := &net.IPNet{IP: a.addr.AsSlice(), Mask: net.CIDRMask(32, 32)}
	if err := m.nl.RouteAdd(&netlink.Route{LinkIndex: veth.Index, Dst: host32, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: host route: %w", a.id, err)
	}
	if err := m.nl.NeighAdd(&netlink.Neigh{LinkIndex: veth.Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: a.addr.AsSlice(), HardwareAddr: guestMAC}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: host neighbour: %w", a.id, err)
	}

	guest, err := gh.LinkByName(m.cfg.GuestLink)
	if err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: guest link: %w", a.id, err)
	}
	if err := gh.AddrAdd(guest, &netlink.Addr{IPNet: host32}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: guest address: %w", a.id, err)
	}
	if err := gh.LinkSetUp(guest); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: guest link up: %w", a.id, err)
	}
	gw := m.cfg.gateway.AsSlice()
	if err := gh.NeighAdd(&netlink.Neigh{LinkIndex: guest.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: gw, HardwareAddr: hostMAC}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: guest neighbour: %w", a.id, err)
	}
	if err := gh.RouteAdd(&netlink.Route{LinkIndex: guest.Attrs().Index, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("netpolicy: sandbox %s: guest default route: %w", a.id, err)
	}
	ok = true
	return nil
}

// removeStale deletes what blocks creating a's links: a host link of that
// name, and a veth named GuestLink in the sandbox's namespace.
func (m *Manager) removeStale(gh *netlink.Handle, a *attachment) {
	if l, err := m.nl.LinkByName(a.link); err == nil {
		m.log.Warn("removing stale sandbox link", "link", a.link, "alias", l.Attrs().Alias)
		_ = m.nl.LinkDel(l)
	}
	if l, err := gh.LinkByName(m.cfg.GuestLink); err == nil && l.Type() == "veth" {
		m.log.Warn("removing stale link inside sandbox", "sandbox", a.id, "link", m.cfg.GuestLink)
		_ = gh.LinkDel(l)
	}
}

// unplumb deletes the host end, and with it the peer. A link already gone
// (the sandbox's namespace died and took the pair with it) is fine.
func (m *Manager) unplumb(a *attachment) error {
	l, err := m.nl.LinkByName(a.link)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("netpolicy: sandbox %s: find link %s: %w", a.id, a.link, err)
	}
	// The alias check guards against deleting a link of the same name
	// that is not this sandbox's (alias is the sandbox id).
	if l.Attrs().Alias != a.id {
		return nil
	}
	if err := m.nl.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("netpolicy: sandbox %s: delete link %s: %w", a.id, a.link, err)
	}
	return nil
}
