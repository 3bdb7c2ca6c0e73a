package reclaim

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestParseSwapSpec(t *testing.T) {
	tests := []struct {
		in   string
		want SwapSpec
		ok   bool
	}{
		{"", SwapSpec{}, true},
		{"off", SwapSpec{}, true},
		{"zram:4G", SwapSpec{Kind: "zram", Size: 4 << 30, Priority: 100}, true},
		{"zram:512MiB:lz4", SwapSpec{Kind: "zram", Size: 512 << 20, Algorithm: "lz4", Priority: 100}, true},
		{"zram:1073741824", SwapSpec{Kind: "zram", Size: 1 << 30, Priority: 100}, true},
		{"zram", SwapSpec{}, false},
		{"zram:", SwapSpec{}, false},
		{"zram:4X", SwapSpec{}, false},
		{"zram:-4G", SwapSpec{}, false},
		{"zram:100K", SwapSpec{}, false}, // below 1 MiB
		{"zram:4G:", SwapSpec{}, false},
		{"zram:4G:lz4:x", SwapSpec{}, false},
		{"disk:4G", SwapSpec{}, false},
		{"zram:99999999999T", SwapSpec{}, false},
	}
	for _, tc := range tests {
		got, err := ParseSwapSpec(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if err != nil && !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: error class %v", tc.in, err)
		}
		if got != tc.want {
			t.Errorf("%q: got %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func zramDevices(t *testing.T) []string {
	t.Helper()
	ents, _ := filepath.Glob("/sys/block/zram*")
	sort.Strings(ents)
	return ents
}

func swapsHas(t *testing.T, dev string) (bool, string) {
	t.Helper()
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && f[0] == dev {
			return true, f[4]
		}
	}
	return false, ""
}

func TestZramSetupTeardown(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "zram (CONFIG_ZRAM)", ZramAvailable("/sys"))
	before := zramDevices(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	z, err := SetupZram(ctx, nil, "/sys", "/dev", SwapSpec{Kind: "zram", Size: 64 << 20, Priority: 77})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = z.Close()
		}
	})
	on, prio := swapsHas(t, z.Device)
	if !on || prio != "77" {
		t.Fatalf("%s in /proc/swaps: %v priority %q", z.Device, on, prio)
	}
	if z.Algorithm == "" {
		t.Error("algorithm not reported")
	}
	if _, _, _, err := z.Stats(); err != nil {
		t.Error(err)
	}
	for _, d := range before {
		if d == "/sys/block/zram"+strconv.Itoa(z.ID) {
			t.Fatalf("SetupZram reused existing device %s", d)
		}
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if on, _ := swapsHas(t, z.Device); on {
		t.Fatal("still in /proc/swaps after Close")
	}
	if _, err := os.Stat("/sys/block/zram" + strconv.Itoa(z.ID)); !os.IsNotExist(err) {
		t.Fatalf("zram%d still present after Close: %v", z.ID, err)
	}
}

func TestZramBadAlgorithmLeavesNothing(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "zram (CONFIG_ZRAM)", ZramAvailable("/sys"))
	before := zramDevices(t)
	_, err := SetupZram(context.Background(), nil, "/sys", "/dev", SwapSpec{Kind: "zram", Size: 64 << 20, Algorithm: "nosuchalgo"})
	if err == nil || !strings.Contains(err.Error(), "available:") {
		t.Fatalf("bad algorithm: %v", err)
	}
	if after := zramDevices(t); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("zram devices %v after failed setup, want %v", after, before)
	}
}

func TestZramBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := SetupZram(ctx, nil, "/sys", "/dev", SwapSpec{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("empty spec: %v", err)
	}
	if _, err := SetupZram(ctx, nil, t.TempDir(), "/dev", SwapSpec{Kind: "zram", Size: 1 << 30}); !errdefs.IsNotImplemented(err) {
		t.Errorf("no zram-control: %v", err)
	}
}
