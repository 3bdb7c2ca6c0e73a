package netpolicy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

var testPresets = map[string][]match{
	"pypi": {{Prefix: netip.MustParsePrefix("192.0.2.10/32"), Proto: protoTCP, PortLo: 443, PortHi: 443}},
}

func TestCompileRule(t *testing.T) {
	any4 := netip.MustParsePrefix("0.0.0.0/0")
	cases := []struct {
		name string
		rule node.NetworkRule
		want []match
	}{
		{"bare address", node.NetworkRule{CIDR: "1.2.3.4"}, []match{{Prefix: netip.MustParsePrefix("1.2.3.4/32")}}},
		{"prefix", node.NetworkRule{CIDR: "10.0.0.0/8"}, []match{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}},
		{"tcp port", node.NetworkRule{CIDR: "1.2.3.4/32", Ports: "443", Protocol: "tcp"},
			[]match{{Prefix: netip.MustParsePrefix("1.2.3.4/32"), Proto: protoTCP, PortLo: 443, PortHi: 443}}},
		{"ports without protocol mean tcp and udp", node.NetworkRule{Ports: "53"},
			[]match{{Prefix: any4, Proto: protoTCP, PortLo: 53, PortHi: 53}, {Prefix: any4, Proto: protoUDP, PortLo: 53, PortHi: 53}}},
		{"range and list", node.NetworkRule{CIDR: "0.0.0.0/0", Ports: "80,8000-9000", Protocol: "udp"},
			[]match{{Prefix: any4, Proto: protoUDP, PortLo: 80, PortHi: 80}, {Prefix: any4, Proto: protoUDP, PortLo: 8000, PortHi: 9000}}},
		{"icmp", node.NetworkRule{CIDR: "1.2.3.4", Protocol: "icmp"}, []match{{Prefix: netip.MustParsePrefix("1.2.3.4/32"), Proto: protoICMP}}},
		{"preset", node.NetworkRule{Preset: "pypi"}, testPresets["pypi"]},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := compileRule(c.rule, testPresets)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestCompileRuleRejects(t *testing.T) {
	cases := []struct {
		rule    node.NetworkRule
		mention string // the error must say what is wrong
	}{
		{node.NetworkRule{}, "empty rule"},
		{node.NetworkRule{CIDR: "10.0.0.1/8"}, "host bits"},
		{node.NetworkRule{CIDR: "10.0.0.0/33"}, "invalid cidr"},
		{node.NetworkRule{CIDR: "example.com"}, "invalid cidr"},
		{node.NetworkRule{CIDR: "::1"}, "only IPv4"},
		{node.NetworkRule{CIDR: "2001:db8::/32"}, "only IPv4"},
		{node.NetworkRule{CIDR: "::ffff:1.2.3.4"}, "only IPv4"},
		{node.NetworkRule{CIDR: " 1.2.3.4"}, "invalid cidr"},
		{node.NetworkRule{Ports: "0"}, "port number"},
		{node.NetworkRule{Ports: "65536"}, "port number"},
		{node.NetworkRule{Ports: "-1"}, "port number"},
		{node.NetworkRule{Ports: "443,"}, "port number"},
		{node.NetworkRule{Ports: "0443"}, "port number"},
		{node.NetworkRule{Ports: "+443"}, "port number"},
		{node.NetworkRule{Ports: "9000-8000"}, "backwards"},
		{node.NetworkRule{Ports: "1-2-3"}, "port number"},
		{node.NetworkRule{Ports: "80", Protocol: "sctp"}, "unknown protocol"},
		{node.NetworkRule{CIDR: "1.2.3.4", Protocol: "TCP"}, "unknown protocol"},
		{node.NetworkRule{Protocol: "icmp", Ports: "1"}, "icmp takes no ports"},
		{node.NetworkRule{Preset: "npm"}, `unknown network preset "npm" (this node knows: pypi)`},
		{node.NetworkRule{Preset: "pypi", Ports: "443"}, "must not also set"},
	}
	for _, c := range cases {
		_, err := compileRule(c.rule, testPresets)
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: err = %v, want invalid argument", c.rule, err)
			continue
		}
		if !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%+v: error %q does not say %q", c.rule, err, c.mention)
		}
	}
	if _, err := compileRule(node.NetworkRule{Preset: "pypi"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("preset inside a preset: %v", err)
	}
}

func TestCompilePolicy(t *testing.T) {
	p := node.NetworkPolicy{
		Allow: []node.NetworkRule{{CIDR: "0.0.0.0/0"}},
		Deny:  []node.NetworkRule{{CIDR: "1.2.3.4"}, {Ports: "bad"}},
	}
	_, err := compilePolicy(p, testPresets)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "deny[1]") {
		t.Fatalf("err = %v; want invalid argument naming deny[1]", err)
	}
	big := node.NetworkPolicy{}
	for range MaxMatches/2 + 1 {
		big.Allow = append(big.Allow, node.NetworkRule{Ports: "1"}) // 2 matches each
	}
	if _, err := compilePolicy(big, testPresets); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("oversized policy: %v", err)
	}
	c, err := compilePolicy(node.NetworkPolicy{Allow: []node.NetworkRule{{Preset: "pypi"}}, Deny: []node.NetworkRule{{CIDR: "10.0.0.0/8"}}}, testPresets)
	if err != nil || len(c.Allow) != 1 || len(c.Deny) != 1 {
		t.Fatalf("compiled %+v, %v", c, err)
	}
	if NeedsEgress(node.NetworkPolicy{Deny: []node.NetworkRule{{CIDR: "10.0.0.0/8"}}}) {
		t.Fatal("a deny-only policy needs no egress")
	}
}

func TestConfigResolve(t *testing.T) {
	r, err := Config{}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if r.Subnet.String() != DefaultSubnet || r.gateway.String() != "10.201.0.1" || r.Table != DefaultTable {
		t.Fatalf("defaults: %+v", r)
	}
	if got := r.addrAt(0x1ff); got.String() != "10.201.1.255" {
		t.Fatalf("addrAt = %s", got)
	}
	if got := r.linkName(0xfffe); got != "dsvfffe" {
		t.Fatalf("linkName = %s", got)
	}
	bad := []struct {
		cfg     Config
		mention string
	}{
		{Config{Subnet: netip.MustParsePrefix("10.201.0.1/16")}, "canonical"},
		{Config{Subnet: netip.MustParsePrefix("fd00::/64")}, "IPv4"},
		{Config{Subnet: netip.MustParsePrefix("10.0.0.0/30")}, "/29"},
		{Config{LinkPrefix: "averylongprefix"}, "too long"},
		{Config{LinkPrefix: "ve th"}, "link names"},
		{Config{Table: "dsec;flush"}, "table name"},
		{Config{MTU: 100}, "mtu"},
		{Config{Protect: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}}, "IPv4"},
		{Config{Presets: map[string][]node.NetworkRule{"PyPI": {{CIDR: "1.2.3.4"}}}}, "preset name"},
		{Config{Presets: map[string][]node.NetworkRule{"pypi": nil}}, "no rules"},
		{Config{Presets: map[string][]node.NetworkRule{"pypi": {{Preset: "npm"}}}}, "not allowed here"},
		{Config{Presets: map[string][]node.NetworkRule{"pypi": {{CIDR: "1.2.3.4/8"}}}}, "host bits"},
		{Config{Exceptions: []node.NetworkRule{{Ports: "x"}}}, "exceptions[0]"},
	}
	for _, c := range bad {
		_, err := NewManager(c.cfg, nil)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%+v: err = %v, want invalid argument mentioning %q", c.cfg, err, c.mention)
		}
	}
}

func TestIntervalElements(t *testing.T) {
	els := intervalElements([]netip.Prefix{
		netip.MustParsePrefix("240.0.0.0/4"),
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("10.1.0.0/16"), // inside the /8: merged
		netip.MustParsePrefix("11.0.0.0/8"),  // adjacent: merged
		netip.MustParsePrefix("192.0.2.2/32"),
	})
	type el struct {
		key string
		end bool
	}
	var got []el
	for _, e := range els {
		got = append(got, el{netip.AddrFrom4([4]byte(e.Key)).String(), e.IntervalEnd})
	}
	want := []el{{"0.0.0.0", true}, {"10.0.0.0", false}, {"12.0.0.0", true},
		{"192.0.2.2", false}, {"192.0.2.3", true}, {"240.0.0.0", false}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}
