// Package netpolicy gives a sandbox egress to the network under a
// default-deny policy.
//
// A sandbox starts in a fresh network namespace with loopback only, and
// most sandboxes never need more: for them this package does nothing at all
// (no link, no rule, no syscall). Only when a sandbox's policy allows
// something does the node agent call Manager.Attach, which wires it up:
//
//   - Routed veth, no bridge. Each sandbox gets a veth pair: the host end
//     (named Config.LinkPrefix + hex index, alias = sandbox ID) stays in the
//     host namespace, the peer is created directly inside the sandbox's
//     namespace as Config.GuestLink with one /32 address from
//     Config.Subnet. The sandbox's default route points at a gateway
//     address (the subnet's first host address) that no interface owns;
//     both ends have permanent neighbour entries, so no ARP or proxy_arp is
//     involved. Everything a sandbox sends is routed (L3) by the host and so
//     passes the host's forward or input hook: unlike a shared bridge, two
//     sandboxes are never L2 neighbours (no ARP/MAC spoofing of each other,
//     no br_netfilter needed), strict rp_filter works, and the host end
//     needs no address.
//
//   - One nftables table (Config.Table, family inet) owned by dsec:
//     base chains forward and input (filter) and postrouting (nat). Packets
//     coming in on a sandbox link are dispatched through a verdict map keyed
//     by interface name to the sandbox's own chain, so the cost per packet
//     does not grow with the number of sandboxes. A sandbox chain:
//     non-IPv4 -> drop; source address not the sandbox's -> drop (anti
//     spoofing); jump guard; the sandbox's deny rules -> reject; its allow
//     rules -> accept; reject. The shared guard chain lets the operator's
//     exceptions (Config.Exceptions) through to the policy and rejects
//     every protected destination: the protected set (the node's sandbox
//     subnet, link-local 169.254.0.0/16, loopback, 0.0.0.0/8, multicast,
//     the host's addresses found at setup, Config.Protect such as the dsec
//     server's addresses) and, through a fib lookup at packet time, any
//     address that is local, broadcast or multicast on the host, so an
//     address added to the host later is covered too. The input chain sends
//     a sandbox's packets to the host itself through the same sandbox
//     chain, so host sockets are reachable only where an operator exception
//     and the sandbox's own allow rules both say so. Packets routed into a
//     sandbox are accepted only as replies (conntrack established/related):
//     nothing can open a connection to a sandbox through the host, other
//     sandboxes included (the host's own processes can; they are trusted).
//     A sandbox interface without a chain (stale) is rejected: fail closed.
//
//   - Policy is checked on every packet the sandbox sends, not only the
//     first of a connection, and Update replaces a sandbox's chain in one
//     nftables transaction; so a change applies to the very next packet,
//     also of connections already open, without touching the sandbox.
//     Denied traffic is rejected (ICMP admin-prohibited) so clients fail
//     fast instead of hanging.
//
//   - Allowed traffic leaves with the host's address (masquerade) unless
//     Config.DisableMasquerade is set for an operator who routes the
//     sandbox subnet.
//
// Host-level changes, all undone by Close: the nftables table;
// net.ipv4.ip_forward is set to 1 at the first Attach if it was 0 — and
// then the forward chain drops every other forwarded IPv4 packet, so the
// host does not start routing anything but sandbox traffic — and set back
// to 0 by Close. Several Managers may share a host (a server and tests, or
// two servers with their own tables, subnets and prefixes): every sandbox
// link is in interface group LinkGroup, which each Manager's drop rule
// lets through, and the rule's comment is a marker that the others read:
// ip_forward goes back to 0 only when the last marked table goes, and a
// Manager that finds ip_forward on and a marked table (a live one's, or
// one left by a process that died before Close) knows the host's own
// setting was off. IPv6 is switched off on each host-side link. Nothing
// else is touched: no bridge, no per-sandbox sysctl, no other table.
//
// Other firewalls: nftables evaluates every base chain on a hook, and a
// drop anywhere is final. A host whose own forward chain drops by default
// (Docker's iptables FORWARD policy, for one) must accept traffic from and
// to Config.Subnet for sandbox egress to work.
//
// IPv4 only: IPv6 rules are refused; sandboxes' IPv6 packets are dropped.
package netpolicy
