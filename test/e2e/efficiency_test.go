package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/reclaim"
)

type capacityJSON struct {
	Fits             int            `json:"fits"`
	LimitingResource string         `json:"limiting_resource"`
	Detail           map[string]int `json:"detail"`
}

type inspectJSON struct {
	ID                     string  `json:"id"`
	State                  string  `json:"state"`
	CPURequested           float64 `json:"cpu_requested"`
	CPUUsed                float64 `json:"cpu_used"`
	MemoryHeldBytes        int64   `json:"memory_held_bytes"`
	MemoryReclaimableBytes int64   `json:"memory_reclaimable_bytes"`
	MemorySwappedBytes     int64   `json:"memory_swapped_bytes"`
	Runtime                struct {
		Pid    int    `json:"pid"`
		Cgroup string `json:"cgroup"`
	} `json:"runtime"`
}

func (s *server) capacity(args ...string) capacityJSON {
	s.t.Helper()
	return decodeJSON[capacityJSON](s.t, s.mustCLI(append([]string{"node", "capacity", "--json"}, args...)...))
}

func (s *server) inspectSandbox(id string) inspectJSON {
	s.t.Helper()
	return decodeJSON[inspectJSON](s.t, s.mustCLI("sandbox", "inspect", id, "--json"))
}

func readMeminfo(t *testing.T) reclaim.Node {
	t.Helper()
	n, err := reclaim.ReadNode("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func cgroupFile(t *testing.T, ctrl, group, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, group, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Admission is by measured use: sandboxes whose memory limits add up to
// more than the host has are admitted while they hold little; a shape that
// cannot fit is refused naming the short resource; an unmeasured
// newcomer's CPU request counts only until its use is measured.
func TestAdmissionByMeasuredUse(t *testing.T) {
	// A newcomer counts with its whole request until measured (the default
	// is a fraction of it), to make the arithmetic below exact.
	s := startServer(t, "--cpu-overcommit", "3", "--expected-cpu-fraction", "1")
	s.importTestImage("busybox:1")
	mem := readMeminfo(t)

	c := s.capacity("--cpu", "1", "--memory", "512Mi")
	if c.Detail["cpu"] != 6 || c.Fits > 6 || c.LimitingResource == "" {
		t.Fatalf("empty node, 2 cores x 3: %+v", c)
	}
	// Memory fits from measured MemAvailable minus the 512 MiB reserve
	// (the machine is shared: allow some drift).
	want := int((mem.Available - 512<<20) / (512 << 20))
	if got := c.Detail["memory"]; got < want-3 || got > want+3 {
		t.Fatalf("memory fits %d, MemAvailable %d says about %d", got, mem.Available, want)
	}

	// Two sandboxes each limited to 60% of the memory free for sandboxes:
	// by requests the second could not fit; by measured use both do.
	big := fmt.Sprintf("%dMi", (mem.Available-512<<20)*6/10>>20)
	var ids []string
	for i := 0; i < 2; i++ {
		ids = append(ids, strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1", "--memory", big)))
	}

	// A limit beyond what is free is refused, naming memory.
	huge := fmt.Sprintf("%dMi", mem.Total*2>>20)
	_, errOut, code := s.cli("sandbox", "create", "--image", "busybox:1", "--memory", huge)
	if code == 0 || !strings.Contains(errOut, "memory") {
		t.Fatalf("create with --memory %s: exit %d, %q; want a refusal naming memory", huge, code, errOut)
	}
	_, errOut, code = s.cli("sandbox", "create", "--image", "busybox:1", "--cpu", "7")
	if code == 0 || !strings.Contains(errOut, "cpu") {
		t.Fatalf("create with --cpu 7 on 6 schedulable cores: exit %d, %q; want a refusal naming cpu", code, errOut)
	}
	if c := s.capacity("--cpu", "1", "--memory", huge); c.Fits != 0 || c.LimitingResource != "memory" {
		t.Fatalf("capacity for a shape larger than the host: %+v", c)
	}

	// Until measured, each sandbox counts with its 1-core request (6-2);
	// once measured idle, the node has room for 6 again.
	if c := s.capacity("--cpu", "1", "--memory", "64Mi"); c.Detail["cpu"] > 4 {
		t.Fatalf("unmeasured sandboxes did not count: %+v", c)
	}
	deadline := time.Now().Add(40 * time.Second)
	for {
		c := s.capacity("--cpu", "1", "--memory", "64Mi")
		if c.Detail["cpu"] == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle sandboxes still count as their requests after 40s: %+v", c)
		}
		time.Sleep(time.Second)
	}
	for _, id := range ids {
		if st := s.inspectSandbox(id); st.State != "running" || st.MemoryHeldBytes <= 0 || st.CPURequested != 1 {
			t.Fatalf("inspect %s: %+v", id, st)
		}
	}
}

// An idle sandbox's memory is pushed to the compressed swap tier; the
// sandbox keeps running with its data, its next exec works, reclaim leaves
// the group's limit and OOM setting as they were, and the swap device goes
// away with the server.
func TestReclaimIdleSandbox(t *testing.T) {
	if !reclaim.ZramAvailable("/sys") {
		t.Skip("zram not available")
	}
	s := startServer(t, "--swap", "zram:256M", "--reclaim-idle-after", "3s")
	dev := regexp.MustCompile(`"device":"(/dev/zram[0-9]+)"`).FindStringSubmatch(s.log.String())
	if dev == nil {
		t.Fatalf("server log names no zram device:\n%s", s.log.String())
	}
	if !strings.Contains(readSwaps(t), dev[1]) {
		t.Fatalf("%s is not swap while serving", dev[1])
	}
	s.importTestImage("busybox:1")
	id := strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1", "--memory", "128Mi"))
	// A process holding 24 MB of anonymous memory, and 8 MB of file data.
	s.sh(id, `sh -c "x=\$(head -c 24000000 /dev/zero | tr '\0' a); echo \$\$ > /tmp/holder; while :; do sleep 1000; done" >/dev/null 2>&1 &
		head -c 8000000 /dev/urandom > /tmp/data; sleep 1; test -s /tmp/holder`)
	sum := s.sh(id, "md5sum /tmp/data")
	holder := strings.TrimSpace(s.sh(id, "cat /tmp/holder"))
	before := s.inspectSandbox(id)
	if before.MemoryHeldBytes < 24<<20 {
		t.Fatalf("held %d before idling, want the 24 MB at least", before.MemoryHeldBytes)
	}
	group := before.Runtime.Cgroup
	limit, oom := cgroupFile(t, "memory", group, "memory.limit_in_bytes"), cgroupFile(t, "memory", group, "memory.oom_control")

	var after inspectJSON
	deadline := time.Now().Add(60 * time.Second)
	for {
		time.Sleep(2 * time.Second)
		// Read the cgroup directly: an API call would count as activity.
		swapped := cgroupStat(t, group, "swap")
		if swapped >= 16<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60s idle only %d bytes of %s are swapped\n%s", swapped, id, s.log.String())
		}
	}
	after = s.inspectSandbox(id)
	if after.State != "running" || after.MemoryHeldBytes >= before.MemoryHeldBytes-16<<20 {
		t.Fatalf("held %d -> %d, state %s", before.MemoryHeldBytes, after.MemoryHeldBytes, after.State)
	}
	if got := cgroupFile(t, "memory", group, "memory.limit_in_bytes"); got != limit {
		t.Fatalf("memory limit %s after reclaim, was %s", got, limit)
	}
	if got := cgroupFile(t, "memory", group, "memory.oom_control"); got != oom {
		t.Fatalf("oom_control %q after reclaim, was %q", got, oom)
	}
	if got := cgroupFile(t, "memory", group, "memory.oom_control"); !strings.Contains(got, "oom_kill 0") {
		t.Fatalf("something was OOM-killed: %s", got)
	}
	// Woken: same data, the holder still alive, execs work.
	if got := s.sh(id, "md5sum /tmp/data"); got != sum {
		t.Fatalf("data changed: %q -> %q", sum, got)
	}
	s.sh(id, "kill -0 "+holder)
	if got := strings.TrimSpace(s.sh(id, "echo ok")); got != "ok" {
		t.Fatalf("exec after reclaim printed %q", got)
	}

	s.mustCLI("sandbox", "rm", id)
	s.stop()
	if got := readSwaps(t); strings.Contains(got, dev[1]+" ") {
		t.Fatalf("swap device %s left after the server stopped:\n%s", dev[1], got)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", strings.TrimPrefix(dev[1], "/dev/"))); err == nil {
		t.Fatalf("zram device %s left after the server stopped", dev[1])
	}
}

func readSwaps(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cgroupStat reads one v1 memory.stat counter of group.
func cgroupStat(t *testing.T, group, key string) int64 {
	t.Helper()
	for _, line := range strings.Split(cgroupFile(t, "memory", group, "memory.stat"), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// QoS classes map to the cgroup's CPU settings (weight, cpu.idle for
// batch) and nothing of them outlives the sandbox.
func TestQoSClassesLeaveNothingBehind(t *testing.T) {
	s := startServer(t)
	s.importTestImage("busybox:1")
	want := map[string][2]string{ // class -> cpu.shares, cpu.idle
		"latency":  {"10240", "0"},
		"standard": {"1024", "0"},
		"batch":    {"", "1"},
	}
	var ids []string
	for _, class := range []string{"latency", "standard", "batch"} {
		id := strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1", "--qos", class, "--cpu", "1"))
		ids = append(ids, id)
		group := s.inspectSandbox(id).Runtime.Cgroup
		if w := want[class]; w[0] != "" {
			if got := cgroupFile(t, "cpu", group, "cpu.shares"); got != w[0] {
				t.Errorf("%s: cpu.shares %s, want %s", class, got, w[0])
			}
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/cpu", group, "cpu.idle")); err == nil {
			if got := cgroupFile(t, "cpu", group, "cpu.idle"); got != want[class][1] {
				t.Errorf("%s: cpu.idle %s, want %s", class, got, want[class][1])
			}
		}
		// Execs run with the class too (they join the group).
		if got := strings.TrimSpace(s.sh(id, "echo ok")); got != "ok" {
			t.Fatalf("%s: exec printed %q", class, got)
		}
	}
	_, errOut, code := s.cli("sandbox", "create", "--image", "busybox:1", "--qos", "realtime")
	if code == 0 || !strings.Contains(errOut, "qos") {
		t.Fatalf("--qos realtime: exit %d %q", code, errOut)
	}
	for _, id := range ids {
		s.mustCLI("sandbox", "rm", id)
	}
	if left := sandboxCgroupsLeft(t, ids...); len(left) > 0 {
		t.Fatalf("cgroups left: %v", left)
	}
}

// `dsec top --once` shows the node's figures from real data.
func TestTopOnceShowsNode(t *testing.T) {
	s := startServer(t)
	s.importTestImage("busybox:1")
	id := strings.TrimSpace(s.mustCLI("sandbox", "create", "--image", "busybox:1"))
	out := s.mustCLI("top", "--once")
	for _, want := range []string{"sandboxes  1", "held", "reclaimable", "limiting resource: ", id} {
		if !strings.Contains(out, want) {
			t.Fatalf("top --once lacks %q:\n%s", want, out)
		}
	}
}
