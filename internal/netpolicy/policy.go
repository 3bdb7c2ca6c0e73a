package netpolicy

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// IP protocol numbers a rule can name.
const (
	protoAny  uint8 = 0
	protoICMP uint8 = 1
	protoTCP  uint8 = 6
	protoUDP  uint8 = 17
)

// MaxMatches caps the compiled size of one policy (a rule with a port list
// or without a protocol compiles to several matches), so one request cannot
// make an unbounded nftables transaction.
const MaxMatches = 512

// match is one compiled rule: destination prefix, L4 protocol and port
// range. Proto 0 means any protocol; PortLo 0 means any port.
type match struct {
	Prefix netip.Prefix
	Proto  uint8
	PortLo uint16
	PortHi uint16
}

func (m match) String() string {
	s := m.Prefix.String()
	switch m.Proto {
	case protoTCP:
		s += " tcp"
	case protoUDP:
		s += " udp"
	case protoICMP:
		s += " icmp"
	}
	if m.PortLo != 0 {
		if m.PortLo == m.PortHi {
			s += fmt.Sprintf(" port %d", m.PortLo)
		} else {
			s += fmt.Sprintf(" ports %d-%d", m.PortLo, m.PortHi)
		}
	}
	return s
}

// compiled is a validated policy.
type compiled struct {
	Allow []match
	Deny  []match
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("netpolicy: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// NeedsEgress reports whether p allows anything at all. A sandbox whose
// policy does not need no Attach: it keeps loopback only.
func NeedsEgress(p node.NetworkPolicy) bool { return len(p.Allow) > 0 }

// compilePolicy validates p and resolves its presets. Errors wrap
// errdefs.ErrInvalidArgument and name the offending rule.
func compilePolicy(p node.NetworkPolicy, presets map[string][]match) (compiled, error) {
	var c compiled
	var err error
	if c.Deny, err = compileRules("deny", p.Deny, presets); err != nil {
		return compiled{}, err
	}
	if c.Allow, err = compileRules("allow", p.Allow, presets); err != nil {
		return compiled{}, err
	}
	if n := len(c.Allow) + len(c.Deny); n > MaxMatches {
		return compiled{}, invalidf("policy compiles to %d matches, more than the limit of %d", n, MaxMatches)
	}
	return c, nil
}

func compileRules(list string, rules []node.NetworkRule, presets map[string][]match) ([]match, error) {
	var out []match
	for i, r := range rules {
		ms, err := compileRule(r, presets)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", list, i, err)
		}
		out = append(out, ms...)
		if len(out) > MaxMatches {
			return nil, invalidf("%s: more than %d matches", list, MaxMatches)
		}
	}
	return out, nil
}

// compileRule turns one rule into matches. presets nil means presets are
// not allowed here (inside a preset's own definition, or an exception).
func compileRule(r node.NetworkRule, presets map[string][]match) ([]match, error) {
	if r.Preset != "" {
		if r.CIDR != "" || r.Ports != "" || r.Protocol != "" {
			return nil, invalidf("rule with preset %q must not also set cidr, ports or protocol", r.Preset)
		}
		if presets == nil {
			return nil, invalidf("preset %q not allowed here", r.Preset)
		}
		ms, ok := presets[r.Preset]
		if !ok {
			return nil, invalidf("unknown network preset %q (this node knows: %s)", r.Preset, presetNames(presets))
		}
		return ms, nil
	}
	if r.CIDR == "" && r.Ports == "" && r.Protocol == "" {
		return nil, invalidf("empty rule: set cidr (0.0.0.0/0 for any address), ports, protocol or preset")
	}
	prefix := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if r.CIDR != "" {
		var err error
		if prefix, err = parseCIDR(r.CIDR); err != nil {
			return nil, err
		}
	}
	var protos []uint8
	switch r.Protocol {
	case "tcp":
		protos = []uint8{protoTCP}
	case "udp":
		protos = []uint8{protoUDP}
	case "icmp":
		if r.Ports != "" {
			return nil, invalidf("protocol icmp takes no ports (got %q)", r.Ports)
		}
		protos = []uint8{protoICMP}
	case "":
		if r.Ports != "" {
			protos = []uint8{protoTCP, protoUDP} // ports mean tcp and udp
		} else {
			protos = []uint8{protoAny}
		}
	default:
		return nil, invalidf("unknown protocol %q (want tcp, udp, icmp or empty for all)", r.Protocol)
	}
	ranges := [][2]uint16{{0, 0}}
	if r.Ports != "" {
		var err error
		if ranges, err = parsePorts(r.Ports); err != nil {
			return nil, err
		}
	}
	out := make([]match, 0, len(protos)*len(ranges))
	for _, pr := range protos {
		for _, rg := range ranges {
			out = append(out, match{Prefix: prefix, Proto: pr, PortLo: rg[0], PortHi: rg[1]})
		}
	}
	return out, nil
}

// parseCIDR accepts an IPv4 prefix in canonical form or a bare IPv4
// address (a /32).
func parseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, invalidf("invalid cidr %q: not an address or prefix", s)
		}
		if !a.Is4() {
			return netip.Prefix{}, invalidf("invalid cidr %q: only IPv4 is supported", s)
		}
		return netip.PrefixFrom(a, 32), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, invalidf("invalid cidr %q: %v", s, err)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, invalidf("invalid cidr %q: only IPv4 is supported", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, invalidf("invalid cidr %q: host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}

// parsePorts parses "443", "8000-9000" or a comma list of those.
func parsePorts(s string) ([][2]uint16, error) {
	var out [][2]uint16
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := parsePort(lo)
		if err != nil {
			return nil, invalidf("invalid ports %q: %v", s, err)
		}
		b := a
		if isRange {
			if b, err = parsePort(hi); err != nil {
				return nil, invalidf("invalid ports %q: %v", s, err)
			}
			if b < a {
				return nil, invalidf("invalid ports %q: range %d-%d is backwards", s, a, b)
			}
		}
		out = append(out, [2]uint16{a, b})
	}
	return out, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s != strconv.FormatUint(n, 10) {
		return 0, fmt.Errorf("%q is not a port number (1-65535)", s)
	}
	return uint16(n), nil
}

func presetNames(presets map[string][]match) string {
	if len(presets) == 0 {
		return "no presets"
	}
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// validPresetName keeps preset names simple tokens for CLI flags and JSON
// keys.
func validPresetName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
