package main

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/client"
)

// sizeUnits are the accepted suffixes: binary (Ki..Ti) and decimal (K..T).
var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"K", 1e3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// parseSize reads "512Mi", "1G", "1.5Gi", "4096" (bytes).
func parseSize(s string) (int64, error) {
	in := strings.TrimSpace(s)
	in = strings.TrimSuffix(in, "B") // "512MiB" and "4096B" read naturally too
	num, mult := in, 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(in, u.suffix) {
			num, mult = strings.TrimSuffix(in, u.suffix), u.mult
			break
		}
	}
	if num == "" {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional Ki/Mi/Gi/Ti or K/M/G/T suffix, e.g. 512Mi", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("invalid size %q: want a number with an optional Ki/Mi/Gi/Ti or K/M/G/T suffix, e.g. 512Mi", s)
	}
	if v < 0 {
		return 0, fmt.Errorf("invalid size %q: must not be negative", s)
	}
	b := v * mult
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	if b != math.Trunc(b) {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	return int64(b), nil
}

// formatSize prints bytes in binary units, compactly.
func formatSize(b int64) string {
	if b < 0 {
		return "-" + formatSize(-b)
	}
	units := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi"}
	v := float64(b)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return strconv.FormatInt(b, 10)
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f%s", v, units[i])
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}

// sizeValue is a pflag.Value for sizes.
type sizeValue struct{ p *int64 }

func (v sizeValue) String() string {
	if v.p == nil || *v.p == 0 {
		return "0"
	}
	return formatSize(*v.p)
}
func (v sizeValue) Set(s string) error {
	b, err := parseSize(s)
	if err != nil {
		return err
	}
	*v.p = b
	return nil
}
func (sizeValue) Type() string { return "size" }

// parseDuration reads Go durations ("30s", "5m", "1h30m") and refuses
// negative ones.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: use Go syntax such as 30s, 5m or 1h30m", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("invalid duration %q: must not be negative", s)
	}
	return d, nil
}

type durationValue struct{ p *time.Duration }

func (v durationValue) String() string {
	if v.p == nil || *v.p == 0 {
		return "0" // pflag treats "0" as "no default worth showing"
	}
	return v.p.String()
}
func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.p = d
	return nil
}
func (durationValue) Type() string { return "duration" }

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]*$`)

// parseEnv checks one K=V entry.
func parseEnv(s string) (string, error) {
	k, _, ok := strings.Cut(s, "=")
	if !ok {
		return "", fmt.Errorf("invalid --env %q: want KEY=VALUE", s)
	}
	if !envKey.MatchString(k) {
		return "", fmt.Errorf("invalid --env %q: %q is not a variable name", s, k)
	}
	if strings.ContainsRune(s, 0) {
		return "", fmt.Errorf("invalid --env %q: contains a NUL byte", s)
	}
	return s, nil
}

type envValue struct{ p *[]string }

func (v envValue) String() string { return strings.Join(*v.p, ",") }
func (v envValue) Set(s string) error {
	e, err := parseEnv(s)
	if err != nil {
		return err
	}
	*v.p = append(*v.p, e)
	return nil
}
func (envValue) Type() string { return "KEY=VALUE" }

var labelKey = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,252}[A-Za-z0-9])?$`)

// parseLabel reads k=v; keys are DNS-ish names, values may be empty but
// not contain '=' (the list filter's separator) or commas.
func parseLabel(s string) (string, string, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", fmt.Errorf("invalid label %q: want key=value", s)
	}
	if !labelKey.MatchString(k) {
		return "", "", fmt.Errorf("invalid label %q: key %q must be letters, digits, '.', '_', '-' or '/'", s, k)
	}
	if strings.ContainsAny(v, "=,\x00\n") {
		return "", "", fmt.Errorf("invalid label %q: value must not contain '=', ',' or control characters", s)
	}
	return k, v, nil
}

type labelValue struct{ m map[string]string }

func (v labelValue) String() string {
	parts := make([]string, 0, len(v.m))
	for k, val := range v.m {
		parts = append(parts, k+"="+val)
	}
	return strings.Join(parts, ",")
}
func (v labelValue) Set(s string) error {
	k, val, err := parseLabel(s)
	if err != nil {
		return err
	}
	if old, dup := v.m[k]; dup && old != val {
		return fmt.Errorf("label %q given twice with different values", k)
	}
	v.m[k] = val
	return nil
}
func (labelValue) Type() string { return "key=value" }

var presetName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// parseRule reads one egress rule:
//
//	preset:NAME                      operator-mapped endpoints (pypi, npm, ...)
//	CIDR[:PORTS][/PROTO]             10.0.0.0/8, 1.2.3.4:443/tcp, 10.0.0.0/8:8000-9000
//	[IPv6CIDR][:PORTS][/PROTO]       [2001:db8::/32]:443
//
// A bare IPv6 CIDR without brackets is accepted when it has no ports.
func parseRule(s string) (client.NetworkRule, error) {
	var r client.NetworkRule
	in := strings.TrimSpace(s)
	if name, ok := strings.CutPrefix(in, "preset:"); ok {
		if !presetName.MatchString(name) {
			return r, fmt.Errorf("invalid rule %q: preset name %q must be lower-case letters, digits, '-' or '_'", s, name)
		}
		r.Preset = name
		return r, nil
	}
	bad := func(why string) (client.NetworkRule, error) {
		return client.NetworkRule{}, fmt.Errorf("invalid rule %q: %s (want CIDR[:PORTS][/tcp|udp] or preset:NAME)", s, why)
	}
	// Protocol: a trailing /tcp or /udp (a CIDR's /N is numeric).
	if i := strings.LastIndexByte(in, '/'); i >= 0 {
		switch p := strings.ToLower(in[i+1:]); p {
		case "tcp", "udp":
			r.Protocol, in = p, in[:i]
		}
	}
	addr, ports := in, ""
	if strings.HasPrefix(in, "[") {
		end := strings.IndexByte(in, ']')
		if end < 0 {
			return bad("unclosed '['")
		}
		addr, ports = in[1:end], in[end+1:]
		if ports != "" {
			p, ok := strings.CutPrefix(ports, ":")
			if !ok {
				return bad("expected ':' after ']'")
			}
			ports = p
		}
	} else if strings.Count(in, ":") == 1 {
		addr, ports, _ = strings.Cut(in, ":")
	}
	if addr == "" {
		return bad("no address")
	}
	if strings.Contains(addr, "/") {
		pfx, err := netip.ParsePrefix(addr)
		if err != nil {
			return bad("not a CIDR")
		}
		if pfx.Masked() != pfx {
			return bad(fmt.Sprintf("host bits set, did you mean %s?", pfx.Masked()))
		}
	} else if _, err := netip.ParseAddr(addr); err != nil {
		return bad("not an IP address or CIDR")
	}
	r.CIDR = addr
	if ports != "" || strings.HasSuffix(in, ":") {
		if err := checkPorts(ports); err != nil {
			return bad(err.Error())
		}
		r.Ports = ports
	}
	return r, nil
}

func checkPorts(p string) error {
	lo, hi, isRange := strings.Cut(p, "-")
	a, err := strconv.Atoi(lo)
	if err != nil || a < 1 || a > 65535 {
		return fmt.Errorf("port %q is not 1-65535", lo)
	}
	if !isRange {
		return nil
	}
	b, err := strconv.Atoi(hi)
	if err != nil || b < 1 || b > 65535 {
		return fmt.Errorf("port %q is not 1-65535", hi)
	}
	if b < a {
		return fmt.Errorf("port range %s is reversed", p)
	}
	return nil
}

type ruleValue struct{ p *[]client.NetworkRule }

func (v ruleValue) String() string {
	parts := make([]string, 0, len(*v.p))
	for _, r := range *v.p {
		parts = append(parts, formatRule(r))
	}
	return strings.Join(parts, ",")
}
func (v ruleValue) Set(s string) error {
	r, err := parseRule(s)
	if err != nil {
		return err
	}
	*v.p = append(*v.p, r)
	return nil
}
func (ruleValue) Type() string { return "rule" }

func formatRule(r client.NetworkRule) string {
	if r.Preset != "" {
		return "preset:" + r.Preset
	}
	s := r.CIDR
	if r.Ports != "" {
		if strings.Contains(s, ":") {
			s = "[" + s + "]"
		}
		s += ":" + r.Ports
	}
	if r.Protocol != "" {
		s += "/" + r.Protocol
	}
	return s
}

// parseMode reads an octal permission like 0644 or 755.
func parseMode(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("invalid mode %q: want octal permissions such as 0644", s)
	}
	return uint32(v), nil
}
