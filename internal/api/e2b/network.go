package e2b

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// allTraffic is E2B's ALL_TRAFFIC selector.
const allTraffic = "0.0.0.0/0"

// parseTarget parses an allowOut/denyOut entry: an IPv4 address or CIDR.
// E2B also takes domain names there; dsec's rules are by address only.
func parseTarget(kind, s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
		return netip.PrefixFrom(a, 32), nil
	}
	return netip.Prefix{}, fmt.Errorf("network %s entry %q: dsec takes IPv4 addresses and CIDRs only (no domain names, no IPv6): %w", kind, s, errdefs.ErrInvalidArgument)
}

// networkPolicy maps E2B's egress settings onto dsec's rules.
//
// E2B: traffic is allowed unless allow_internet_access is false; denyOut
// blocks destinations and allowOut re-allows destinations inside them (allow
// wins). dsec: default deny; deny rules are checked before allow rules. So:
//   - without internet access (allow_internet_access not true, or denyOut
//     holding 0.0.0.0/0), allowOut becomes the allow rules and denyOut adds
//     nothing to the default deny;
//   - with internet access, the allow rule is 0.0.0.0/0 and denyOut become
//     deny rules; an allowOut entry inside a denied range cannot be
//     expressed (dsec's deny would win) and is refused.
//
// Unlike E2B, leaving allow_internet_access unset gives no egress: dsec is
// default-deny, and egress has to be asked for.
func networkPolicy(allowInternet *bool, n *networkConfig) (node.NetworkPolicy, error) {
	var pol node.NetworkPolicy
	internet := allowInternet != nil && *allowInternet
	var allow, deny []netip.Prefix
	if n != nil {
		switch {
		case len(n.Rules) > 0 && string(n.Rules) != "null" && string(n.Rules) != "{}":
			return pol, fmt.Errorf("network rules (request transforms) are not supported by dsec: %w", errdefs.ErrNotImplemented)
		case len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null":
			return pol, fmt.Errorf("network egressProxy is not supported by dsec: %w", errdefs.ErrNotImplemented)
		case n.MaskRequestHost != nil || len(n.HTTPSPorts) > 0 || n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic:
			return pol, fmt.Errorf("network ingress settings (allowPublicTraffic, maskRequestHost, httpsPorts) are not supported by dsec: sandboxes take no inbound traffic: %w", errdefs.ErrNotImplemented)
		}
		for _, s := range n.AllowOut {
			p, err := parseTarget("allowOut", s)
			if err != nil {
				return pol, err
			}
			allow = append(allow, p)
		}
		for _, s := range n.DenyOut {
			p, err := parseTarget("denyOut", s)
			if err != nil {
				return pol, err
			}
			if p.Bits() == 0 {
				internet = false
				continue
			}
			deny = append(deny, p)
		}
	}
	if !internet {
		for _, p := range allow {
			pol.Allow = append(pol.Allow, node.NetworkRule{CIDR: p.String()})
		}
		return pol, nil
	}
	for _, a := range allow {
		for _, d := range deny {
			if a.Overlaps(d) {
				return pol, fmt.Errorf("network: allowOut %s lies inside denyOut %s; dsec applies deny rules first and cannot re-allow part of a denied range: %w", a, d, errdefs.ErrInvalidArgument)
			}
		}
	}
	pol.Allow = []node.NetworkRule{{CIDR: allTraffic}}
	for _, d := range deny {
		pol.Deny = append(pol.Deny, node.NetworkRule{CIDR: d.String()})
	}
	return pol, nil
}

// networkView is the E2B view of a dsec policy: allowOut, denyOut and
// whether the internet at large is allowed.
func networkView(p node.NetworkPolicy) (allowOut, denyOut []string, internet bool) {
	for _, r := range p.Allow {
		if r.CIDR == allTraffic && r.Ports == "" && r.Protocol == "" {
			internet = true
			continue
		}
		if r.CIDR != "" {
			allowOut = append(allowOut, r.CIDR)
		}
	}
	for _, r := range p.Deny {
		if r.CIDR != "" {
			denyOut = append(denyOut, r.CIDR)
		}
	}
	if !internet && len(allowOut) > 0 {
		denyOut = append(denyOut, allTraffic)
	}
	return allowOut, denyOut, internet
}
