package reclaim

import (
	"context"
	"testing"
	"time"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Layer pages warmed from the image-cache group are charged there; a
// sandbox reading the same file afterwards is not charged for them.
func TestWarmFilesChargesImageCache(t *testing.T) {
	cache := v1Group(t, cgroups.Resources{})
	sb := v1Group(t, cgroups.Resources{MemoryLimit: 256 << 20})
	layer := diskFile(t, int(32*mib))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := WarmFiles(ctx, cache, []string{layer, "/nonexistent/dsec"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 1 || res.Bytes != 32*mib || len(res.Failed) != 1 || res.Failed["/nonexistent/dsec"] == "" {
		t.Fatalf("result %+v", res)
	}
	// memcg statistics are flushed lazily (up to ~2s): allow for that,
	// and for a few pages that other activity may have cached first.
	var cs *cgroups.Stats
	waitUntil(t, "image-cache group holds the layer", 5*time.Second, func() bool {
		cs, _ = cache.Stats()
		return cs != nil && int64(cs.File) >= 30*mib
	})
	if p, _ := cache.Procs(); len(p) != 0 {
		t.Fatalf("reader still in the image-cache group: %v", p)
	}
	startHelper(t, sb, "READ_FILE="+layer)
	ss, _ := sb.Stats()
	t.Logf("image cache file %d MiB, sandbox file %d MiB", cs.File>>20, ss.File>>20)
	if int64(ss.File) > 2*mib {
		t.Fatalf("sandbox charged %d MiB for warmed layer pages", ss.File>>20)
	}
}

func TestWarmFilesBadInput(t *testing.T) {
	for _, p := range []string{"", "a\nb"} {
		if _, err := WarmFiles(context.Background(), nil, []string{p}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", p, err)
		}
	}
}
