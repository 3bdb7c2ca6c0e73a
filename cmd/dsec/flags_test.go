package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/client"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"512Mi", 512 << 20, false},
		{"1Gi", 1 << 30, false},
		{"1.5Gi", 3 << 29, false},
		{"4Ki", 4096, false},
		{"2Ti", 2 << 40, false},
		{"1G", 1e9, false},
		{"1M", 1e6, false},
		{"10K", 1e4, false},
		{"10k", 1e4, false},
		{"512MiB", 512 << 20, false},
		{"4096", 4096, false},
		{"0", 0, false},
		{" 1Gi ", 1 << 30, false},
		{"", 0, true},
		{"Mi", 0, true},
		{"-1Gi", 0, true},
		{"1Xi", 0, true},
		{"1.5", 0, true}, // half a byte
		{"abc", 0, true},
		{"1e30Gi", 0, true},
		{"NaN", 0, true},
		{"1 Gi", 0, true},
	} {
		got, err := parseSize(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("parseSize(%q) error = %v, want error %v", tc.in, err, tc.bad)
			continue
		}
		if got != tc.want {
			t.Errorf("parseSize(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 1023: "1023", 1024: "1Ki", 512 << 20: "512Mi", 3 << 29: "1.5Gi", -2048: "-2Ki"} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{"300s", 300 * time.Second, false},
		{"3h", 3 * time.Hour, false},
		{"1h30m", 90 * time.Minute, false},
		{"250ms", 250 * time.Millisecond, false},
		{"0", 0, false},
		{"300", 0, true}, // no unit
		{"-5s", 0, true},
		{"soon", 0, true},
		{"", 0, true},
	} {
		got, err := parseDuration(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want client.NetworkRule
		bad  bool
	}{
		{"preset:pypi", client.NetworkRule{Preset: "pypi"}, false},
		{"preset:npm-mirror", client.NetworkRule{Preset: "npm-mirror"}, false},
		{"10.0.0.0/8", client.NetworkRule{CIDR: "10.0.0.0/8"}, false},
		{"1.2.3.4", client.NetworkRule{CIDR: "1.2.3.4"}, false},
		{"1.2.3.4:443", client.NetworkRule{CIDR: "1.2.3.4", Ports: "443"}, false},
		{"1.2.3.4:443/tcp", client.NetworkRule{CIDR: "1.2.3.4", Ports: "443", Protocol: "tcp"}, false},
		{"10.0.0.0/8:8000-9000/udp", client.NetworkRule{CIDR: "10.0.0.0/8", Ports: "8000-9000", Protocol: "udp"}, false},
		{"10.0.0.0/8/TCP", client.NetworkRule{CIDR: "10.0.0.0/8", Protocol: "tcp"}, false},
		{"2001:db8::/32", client.NetworkRule{CIDR: "2001:db8::/32"}, false},
		{"[2001:db8::/32]:443/tcp", client.NetworkRule{CIDR: "2001:db8::/32", Ports: "443", Protocol: "tcp"}, false},
		{"[::1]:53/udp", client.NetworkRule{CIDR: "::1", Ports: "53", Protocol: "udp"}, false},
		{"preset:", client.NetworkRule{}, true},
		{"preset:PyPI", client.NetworkRule{}, true},
		{"pypi.org", client.NetworkRule{}, true},
		{"10.0.0.1/8", client.NetworkRule{}, true}, // host bits set
		{"10.0.0.0/33", client.NetworkRule{}, true},
		{"1.2.3.4:0", client.NetworkRule{}, true},
		{"1.2.3.4:70000", client.NetworkRule{}, true},
		{"1.2.3.4:9000-8000", client.NetworkRule{}, true},
		{"1.2.3.4:", client.NetworkRule{}, true},
		{"1.2.3.4:http", client.NetworkRule{}, true},
		{"1.2.3.4/sctp", client.NetworkRule{}, true},
		{"[2001:db8::/32", client.NetworkRule{}, true},
		{"[::1]443", client.NetworkRule{}, true},
		{"", client.NetworkRule{}, true},
	} {
		got, err := parseRule(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("parseRule(%q) error = %v, want error %v", tc.in, err, tc.bad)
			continue
		}
		if got != tc.want {
			t.Errorf("parseRule(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if !tc.bad {
			// formatRule must give back something parseRule reads the same.
			again, err := parseRule(formatRule(got))
			if err != nil || again != got {
				t.Errorf("round trip of %q via %q = %+v, %v", tc.in, formatRule(got), again, err)
			}
		}
	}
}

func TestParseEnvAndLabel(t *testing.T) {
	for _, tc := range []struct {
		in  string
		bad bool
	}{
		{"A=1", false}, {"PATH=/bin:/usr/bin", false}, {"EMPTY=", false}, {"X=a=b", false},
		{"NOEQUALS", true}, {"=v", true}, {"1A=x", true}, {"A B=x", true}, {"A=\x00", true},
	} {
		_, err := parseEnv(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("parseEnv(%q) error = %v, want error %v", tc.in, err, tc.bad)
		}
	}
	for _, tc := range []struct {
		in   string
		k, v string
		bad  bool
	}{
		{"run=42", "run", "42", false},
		{"dsec.io/team=rl", "dsec.io/team", "rl", false},
		{"empty=", "empty", "", false},
		{"novalue", "", "", true},
		{"=x", "", "", true},
		{"bad key=x", "", "", true},
		{"k=a,b", "", "", true},
		{"k=a=b", "", "", true},
		{"-lead=x", "", "", true},
	} {
		k, v, err := parseLabel(tc.in)
		if (err != nil) != tc.bad || k != tc.k || v != tc.v {
			t.Errorf("parseLabel(%q) = %q, %q, %v", tc.in, k, v, err)
		}
	}
}

func TestSpecFlags(t *testing.T) {
	a := &app{}
	cmd := newSandboxCreateCmd(a)
	err := cmd.ParseFlags([]string{"--image", "py", "--cpu", "0.5", "--cpu-limit", "2", "--memory", "1Gi", "--disk", "2G",
		"--pids", "64", "--idle-ttl", "300s", "--max-lifetime", "3h", "--on-idle", "pause", "--env", "A=1", "--env", "B=2",
		"--label", "run=1", "--label", "team=rl", "--qos", "batch", "--allow", "preset:pypi", "--allow", "10.0.0.0/8:443/tcp",
		"--deny", "10.0.0.5"})
	if err != nil {
		t.Fatal(err)
	}
	// Read back what the command's flag values hold.
	got := map[string]string{}
	cmd.Flags().VisitAll(func(f *pflagFlag) { got[f.Name] = f.Value.String() })
	want := map[string]string{"memory": "1Gi", "disk": "1.9Gi", "idle-ttl": "5m0s", "max-lifetime": "3h0m0s",
		"env": "A=1,B=2", "allow": "preset:pypi,10.0.0.0/8:443/tcp", "deny": "10.0.0.5", "pids": "64"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("flag %s = %q, want %q", k, got[k], v)
		}
	}
	for _, bad := range [][]string{
		{"--memory", "lots"}, {"--idle-ttl", "5"}, {"--env", "NOPE"}, {"--label", "x"}, {"--allow", "example.com"},
		{"--label", "a=1", "--label", "a=2"},
	} {
		c := newSandboxCreateCmd(a)
		if err := c.ParseFlags(bad); err == nil {
			t.Errorf("flags %v accepted", bad)
		}
	}
	sfv := specFlags{spec: client.SandboxSpec{Image: "x", OnIdle: "sleep"}}
	if err := sfv.validate(); err == nil {
		t.Error("--on-idle sleep accepted")
	}
	sfv = specFlags{spec: client.SandboxSpec{Image: "x", QoS: "fast"}}
	if err := sfv.validate(); err == nil {
		t.Error("--qos fast accepted")
	}
	sfv = specFlags{spec: client.SandboxSpec{Image: "x", CPU: 2, CPULimit: 1}}
	if err := sfv.validate(); err == nil {
		t.Error("cpu above cpu-limit accepted")
	}
	sfv = specFlags{spec: client.SandboxSpec{Image: "x", Network: client.NetworkPolicy{Deny: []client.NetworkRule{{Preset: "pypi"}}}}}
	if err := sfv.validate(); err == nil {
		t.Error("deny preset accepted")
	}
	sfv = specFlags{spec: client.SandboxSpec{Image: "x"}, labels: map[string]string{"a": "b"}}
	if err := sfv.validate(); err != nil || !reflect.DeepEqual(sfv.spec.Labels, map[string]string{"a": "b"}) {
		t.Errorf("labels not carried: %v %v", sfv.spec.Labels, err)
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		res  client.ExecResult
		want int
	}{
		{client.ExecResult{ExitCode: 0}, 0},
		{client.ExecResult{ExitCode: 3}, 3},
		{client.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, 137},
		{client.ExecResult{Signal: "KILL"}, 137},
		{client.ExecResult{Signal: "killed"}, 137},
		{client.ExecResult{Signal: "15"}, 143},
		{client.ExecResult{Signal: "SIGINT"}, 130},
		{client.ExecResult{ExitCode: 300}, 255},
		{client.ExecResult{Signal: "WEIRD", ExitCode: 0}, 137},
	} {
		if got := exitStatus(&tc.res); got != tc.want {
			t.Errorf("exitStatus(%+v) = %d, want %d", tc.res, got, tc.want)
		}
	}
}

func TestLatencies(t *testing.T) {
	var lats []time.Duration
	for i := 1; i <= 100; i++ {
		lats = append(lats, time.Duration(i)*time.Millisecond)
	}
	p50, p90, p99, mx, mean := latencies(lats)
	if p50 != 50 || p90 != 90 || p99 != 99 || mx != 100 || mean != 50.5 {
		t.Fatalf("latencies = %v %v %v %v %v", p50, p90, p99, mx, mean)
	}
	start := time.Unix(0, 0)
	var ops []op
	// 20 ops: first 18 done by t=1s, last 2 at 1.5s and 2s -> k=2 over
	// the window from 1s to 2s.
	for i := range 18 {
		ops = append(ops, op{done: true, end: start.Add(time.Duration(i+1) * time.Second / 18)})
	}
	ops = append(ops, op{done: true, end: start.Add(1500 * time.Millisecond)}, op{done: true, end: start.Add(2 * time.Second)},
		op{done: true, err: errTest, end: start.Add(10 * time.Second)})
	if got := rateAtEnd(ops, start); got != 2 {
		t.Fatalf("rateAtEnd = %v, want 2", got)
	}
}
