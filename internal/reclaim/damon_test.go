package reclaim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/testutil"
)

func TestDetectDAMONFake(t *testing.T) {
	type file struct{ path, content string }
	tests := []struct {
		name     string
		files    []file
		present  bool
		canStart bool
		reason   string
	}{
		{name: "no sysfs interface", present: false, reason: "CONFIG_DAMON_SYSFS"},
		{name: "none configured", files: []file{{"nr_kdamonds", "0\n"}}, present: true, canStart: true},
		{name: "idle kdamond, physical only",
			files:   []file{{"nr_kdamonds", "1\n"}, {"0/state", "off\n"}, {"0/contexts/0/avail_operations", "paddr\n"}},
			present: true, canStart: true, reason: "CONFIG_DAMON_VADDR"},
		{name: "garbage count", files: []file{{"nr_kdamonds", "many\n"}}, present: true, reason: "unreadable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sys := t.TempDir()
			dir := filepath.Join(sys, "kernel/mm/damon/admin/kdamonds")
			for _, f := range tc.files {
				p := filepath.Join(dir, f.path)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			st := DetectDAMON(sys)
			if st.Present != tc.present || st.CanStart != tc.canStart || !strings.Contains(st.Reason, tc.reason) {
				t.Fatalf("got %+v, want present=%v canStart=%v reason~%q", st, tc.present, tc.canStart, tc.reason)
			}
			// Nothing written when no kdamond runs.
			for _, f := range tc.files {
				if b, _ := os.ReadFile(filepath.Join(dir, f.path)); string(b) != f.content {
					t.Fatalf("%s changed to %q", f.path, b)
				}
			}
		})
	}
}

// On the host: if a kdamond runs, a second is refused and the running one is
// untouched; if none runs, detection writes nothing.
func TestDetectDAMONHost(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := "/sys/kernel/mm/damon/admin/kdamonds"
	testutil.RequiresFeature(t, "DAMON sysfs (CONFIG_DAMON_SYSFS)", isFile(filepath.Join(dir, "nr_kdamonds")))
	snap := func() string {
		var b strings.Builder
		n, _ := os.ReadFile(filepath.Join(dir, "nr_kdamonds"))
		b.Write(n)
		ents, _ := filepath.Glob(filepath.Join(dir, "[0-9]*"))
		for _, e := range ents {
			for _, f := range []string{"state", "pid", "contexts/nr_contexts", "contexts/0/operations"} {
				v, _ := os.ReadFile(filepath.Join(e, f))
				b.WriteString(e + "/" + f + "=" + string(v))
			}
		}
		return b.String()
	}
	before := snap()
	st := DetectDAMON("/sys")
	t.Logf("DAMON: %+v", st)
	if !st.Present {
		t.Fatalf("not detected: %+v", st)
	}
	if st.Running > 0 {
		if st.CanStart || !strings.Contains(st.Reason, "EBUSY") {
			t.Errorf("running kdamond, but %+v", st)
		}
	} else if !st.CanStart {
		t.Errorf("no kdamond running, but %+v", st)
	}
	if after := snap(); after != before {
		t.Fatalf("detection changed DAMON state:\n%s\n---\n%s", before, after)
	}
}
