package api

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// validID accepts what node ids accept: 1-64 of a-z 0-9 - _.
func validID(what, id string) error {
	if id == "" {
		return invalid("%s is empty", what)
	}
	if len(id) > 64 {
		return invalid("%s is longer than 64 bytes", what)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return invalid("%s %q: only a-z, 0-9, - and _ are allowed", what, id)
		}
	}
	return nil
}

// validName is for tenant names: like ids, starting with a letter or digit.
func validName(what, name string) error {
	if err := validID(what, name); err != nil {
		return err
	}
	if name[0] == '-' || name[0] == '_' {
		return invalid("%s %q must start with a letter or digit", what, name)
	}
	return nil
}

// validExecID accepts node exec ids (opaque, but bounded and printable).
func validExecID(id string) error {
	if id == "" || len(id) > 128 {
		return invalid("exec id must be 1-128 bytes")
	}
	for _, c := range id {
		if c <= ' ' || c == '/' || c > '~' {
			return invalid("exec id %q has a character that is not allowed", id)
		}
	}
	return nil
}

// validPath checks a path inside a sandbox. The node resolves it with
// RESOLVE_IN_ROOT, so ".." cannot escape; here we only refuse what can
// never be right.
func validPath(what, p string) error {
	switch {
	case p == "":
		return invalid("%s is required", what)
	case !strings.HasPrefix(p, "/"):
		return invalid("%s %q must be absolute", what, p)
	case len(p) > 4096:
		return invalid("%s is longer than 4096 bytes", what)
	case strings.IndexByte(p, 0) >= 0:
		return invalid("%s contains a NUL byte", what)
	}
	return nil
}

// parseRef splits NAME[:TAG]; the tag defaults to "latest". The name may
// hold '/' separated components of [a-z0-9._-].
func parseRef(ref string) (name, tag string, err error) {
	if ref == "" {
		return "", "", invalid("image reference is empty")
	}
	if len(ref) > 255 {
		return "", "", invalid("image reference is longer than 255 bytes")
	}
	name, tag = ref, "latest"
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		name, tag = ref[:i], ref[i+1:]
	}
	if name == "" || tag == "" {
		return "", "", invalid("image reference %q: want NAME[:TAG]", ref)
	}
	for _, comp := range strings.Split(name, "/") {
		if comp == "" || comp == "." || comp == ".." {
			return "", "", invalid("image reference %q: empty or dot path component", ref)
		}
		for _, c := range comp {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return "", "", invalid("image reference %q: names use only a-z, 0-9, '.', '_', '-' and '/'", ref)
			}
		}
	}
	for _, c := range tag {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "", "", invalid("image reference %q: tags use only letters, digits, '.', '_' and '-'", ref)
		}
	}
	return name, tag, nil
}

// normRef returns NAME:TAG.
func normRef(ref string) (string, error) {
	name, tag, err := parseRef(ref)
	if err != nil {
		return "", err
	}
	return name + ":" + tag, nil
}

func newSandboxID() string { return "sb-" + randHex(8) }

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// prepareSpec validates a create request and fills defaults, so that what
// is reserved against the quota is exactly what the node is asked for.
func (s *ControlPlane) prepareSpec(spec *node.SandboxSpec) error {
	if spec.ID == "" {
		spec.ID = newSandboxID()
	}
	if err := validID("sandbox id", spec.ID); err != nil {
		return err
	}
	if spec.Image == "" && spec.FromSandbox == "" {
		return invalid("image is required")
	}
	if spec.Image != "" {
		ref, err := normRef(spec.Image)
		if err != nil {
			return err
		}
		spec.Image = ref
	}
	if spec.FromSandbox != "" {
		if err := validID("from_sandbox", spec.FromSandbox); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name string
		neg  bool
	}{
		{"cpu", spec.CPU < 0}, {"cpu_limit", spec.CPULimit < 0}, {"memory_bytes", spec.MemoryBytes < 0},
		{"pids", spec.Pids < 0}, {"disk_bytes", spec.DiskBytes < 0}, {"idle_ttl", spec.IdleTTL < 0},
		{"max_lifetime", spec.MaxLifetime < 0},
	} {
		if f.neg {
			return invalid("%s must not be negative", f.name)
		}
	}
	if spec.CPU == 0 {
		spec.CPU = s.cfg.DefaultCPU
	}
	if spec.CPULimit > 0 && spec.CPULimit < spec.CPU {
		return invalid("cpu_limit (%g) is below the cpu request (%g)", spec.CPULimit, spec.CPU)
	}
	if spec.MemoryBytes == 0 {
		spec.MemoryBytes = s.cfg.DefaultMemoryBytes
	}
	if spec.DiskBytes == 0 {
		spec.DiskBytes = s.cfg.DefaultDiskBytes
	}
	if spec.IdleTTL == 0 {
		spec.IdleTTL = s.cfg.DefaultIdleTTL
	}
	if spec.MaxLifetime == 0 {
		spec.MaxLifetime = s.cfg.DefaultMaxLifetime
	}
	if c := s.cfg.MaxLifetimeCap; c > 0 && (spec.MaxLifetime == 0 || spec.MaxLifetime > c) {
		spec.MaxLifetime = c
	}
	switch spec.OnIdle {
	case "":
		spec.OnIdle = "delete"
	case "delete", "pause":
	default:
		return invalid("on_idle %q: want delete or pause", spec.OnIdle)
	}
	switch spec.QoS {
	case "":
		spec.QoS = node.QoSStandard
	case node.QoSLatency, node.QoSStandard, node.QoSBatch:
	default:
		return invalid("qos %q: want latency, standard or batch", spec.QoS)
	}
	if len(spec.Labels) > 64 {
		return invalid("at most 64 labels")
	}
	for k, v := range spec.Labels {
		if k == "" || len(k) > 128 || len(v) > 512 || strings.ContainsAny(k, "=\x00") {
			return invalid("label %q: keys are 1-128 bytes without '=', values at most 512 bytes", k)
		}
	}
	for _, e := range spec.Env {
		if i := strings.IndexByte(e, '='); i < 1 || strings.IndexByte(e, 0) >= 0 {
			return invalid("env entry %q: want NAME=VALUE", e)
		}
	}
	return validPolicy(spec.Network)
}

func validPolicy(p node.NetworkPolicy) error {
	check := func(kind string, rules []node.NetworkRule) error {
		for i, r := range rules {
			if r.CIDR == "" && r.Preset == "" {
				return invalid("network %s rule %d: needs a cidr or a preset", kind, i)
			}
			if r.CIDR != "" {
				if _, _, err := net.ParseCIDR(r.CIDR); err != nil && net.ParseIP(r.CIDR) == nil {
					return invalid("network %s rule %d: %q is not an address or CIDR", kind, i, r.CIDR)
				}
			}
			switch r.Protocol {
			case "", "tcp", "udp":
			default:
				return invalid("network %s rule %d: protocol %q: want tcp or udp", kind, i, r.Protocol)
			}
			if r.Ports != "" {
				lo, hi, ok := strings.Cut(r.Ports, "-")
				if !ok {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
					return invalid("network %s rule %d: ports %q: want N or N-M within 1-65535", kind, i, r.Ports)
				}
			}
		}
		return nil
	}
	if err := check("allow", p.Allow); err != nil {
		return err
	}
	return check("deny", p.Deny)
}

func validExec(req *node.ExecRequest) error {
	if len(req.Args) == 0 && req.Shell == "" {
		return invalid("exec needs args or shell")
	}
	if len(req.Args) > 0 && req.Shell != "" {
		return invalid("exec takes args or shell, not both")
	}
	if req.Timeout < 0 || req.OutputCap < 0 {
		return invalid("timeout and output_cap must not be negative")
	}
	if req.Cwd != "" {
		if err := validPath("cwd", req.Cwd); err != nil {
			return err
		}
	}
	for _, e := range req.Env {
		if i := strings.IndexByte(e, '='); i < 1 {
			return invalid("env entry %q: want NAME=VALUE", e)
		}
	}
	return nil
}

func validTimeout(d time.Duration) error {
	if d <= 0 {
		return invalid("timeout must be positive")
	}
	return nil
}
