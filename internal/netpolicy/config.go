package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/dsec-dev/dsec/internal/node"
)

// Defaults for the zero Config fields.
const (
	DefaultSubnet     = "10.201.0.0/16"
	DefaultLinkPrefix = "dsv"
	DefaultTable      = "dsec"
	DefaultGuestLink  = "eth0"
)

// LinkGroup is the interface group (ip link ... group) of every sandbox
// link's host end, whatever Manager made it. It lets each Manager's
// forward chain tell dsec sandbox traffic, its own or another's, from the
// rest of the host's.
const LinkGroup uint32 = 0xd5ec

// Config is the node operator's network configuration.
type Config struct {
	// Subnet is where sandbox addresses come from (one /32 each; the
	// first host address is the sandboxes' gateway). It must not be used
	// by anything else on the host. Default DefaultSubnet.
	Subnet netip.Prefix
	// LinkPrefix names the host ends of sandbox links: prefix + hex index.
	// Every interface with this prefix is treated as a sandbox link.
	// Default DefaultLinkPrefix.
	LinkPrefix string
	// Table is the nftables table (family inet) owned by this Manager.
	// Default DefaultTable.
	Table string
	// GuestLink is the interface name inside the sandbox. Default
	// DefaultGuestLink.
	GuestLink string
	// MTU of sandbox links; 0 = kernel default.
	MTU int
	// Presets maps a preset name ("pypi", "npm", ...) to the endpoints
	// (mirrors) it stands for. A preset's rules cannot name presets.
	Presets map[string][]node.NetworkRule
	// Exceptions lift the always-deny protection for these destinations
	// (a package mirror on the host, say). A sandbox still needs its own
	// allow rule (or a preset) to reach them.
	Exceptions []node.NetworkRule
	// Protect adds destinations no sandbox may reach whatever its rules:
	// the dsec server's addresses, other nodes' sandbox subnets, the
	// cluster's internal networks.
	Protect []netip.Prefix
	// DisableMasquerade leaves the source address of allowed traffic as
	// the sandbox's own, for networks that route Subnet to this node.
	DisableMasquerade bool
}

// resolved is a validated Config with defaults applied.
type resolved struct {
	Config
	gateway    netip.Addr
	size       uint32 // addresses in Subnet
	presets    map[string][]match
	exceptions []match
}

func (c Config) resolve() (*resolved, error) {
	r := &resolved{Config: c}
	if !r.Subnet.IsValid() {
		r.Subnet = netip.MustParsePrefix(DefaultSubnet)
	}
	if r.LinkPrefix == "" {
		r.LinkPrefix = DefaultLinkPrefix
	}
	if r.Table == "" {
		r.Table = DefaultTable
	}
	if r.GuestLink == "" {
		r.GuestLink = DefaultGuestLink
	}
	if !r.Subnet.Addr().Is4() || r.Subnet.Masked() != r.Subnet {
		return nil, invalidf("subnet %s: want a canonical IPv4 prefix", r.Subnet)
	}
	if r.Subnet.Bits() < 8 || r.Subnet.Bits() > 29 {
		return nil, invalidf("subnet %s: prefix length must be between /8 and /29", r.Subnet)
	}
	r.size = 1 << (32 - r.Subnet.Bits())
	r.gateway = r.Subnet.Addr().Next()
	// Host link names are at most 15 bytes (IFNAMSIZ-1).
	if n := len(r.LinkPrefix) + len(strconv.FormatUint(uint64(r.size-1), 16)); n > 15 {
		return nil, invalidf("link prefix %q too long for subnet %s: names would be %d bytes, the limit is 15", r.LinkPrefix, r.Subnet, n)
	}
	if !validLinkName(r.LinkPrefix) || !validLinkName(r.GuestLink) || len(r.GuestLink) > 15 {
		return nil, invalidf("link names %q/%q: use letters, digits, '-' and '_'", r.LinkPrefix, r.GuestLink)
	}
	if len(r.Table) > 255 || !validLinkName(r.Table) {
		return nil, invalidf("table name %q: use letters, digits, '-' and '_'", r.Table)
	}
	if r.MTU < 0 || r.MTU > 65535 || (r.MTU != 0 && r.MTU < 576) {
		return nil, invalidf("mtu %d: want 0 (default) or 576-65535", r.MTU)
	}
	for _, p := range r.Protect {
		if !p.IsValid() || !p.Addr().Is4() {
			return nil, invalidf("protect %s: only IPv4 prefixes are supported", p)
		}
	}
	r.presets = make(map[string][]match, len(c.Presets))
	for name, rules := range c.Presets {
		if !validPresetName(name) {
			return nil, invalidf("preset name %q: use lower-case letters, digits, '-', '_' and '.'", name)
		}
		if len(rules) == 0 {
			return nil, invalidf("preset %q has no rules", name)
		}
		ms, err := compileRules("preset "+name, rules, nil)
		if err != nil {
			return nil, err
		}
		r.presets[name] = ms
	}
	ex, err := compileRules("exceptions", c.Exceptions, nil)
	if err != nil {
		return nil, err
	}
	r.exceptions = ex
	return r, nil
}

func validLinkName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// addrAt is the index-th address of the subnet.
func (r *resolved) addrAt(index uint32) netip.Addr {
	b := r.Subnet.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += index
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (r *resolved) linkName(index uint32) string {
	return r.LinkPrefix + strconv.FormatUint(uint64(index), 16)
}

func (r *resolved) chainName(index uint32) string {
	return fmt.Sprintf("sbx-%x", index)
}
