package e2b

import (
	"strconv"
	"testing"
)

// TestCacheBounded: the per-sandbox maps stay bounded however many
// sandboxes pass through.
func TestCacheBounded(t *testing.T) {
	h := NewHandler(nil)
	defer h.Close()
	for i := range maxCached + 100 {
		h.remember("sb-"+strconv.Itoa(i), sandboxAuth{tenant: "t", token: "x"})
	}
	if n := len(h.sandboxes); n != maxCached {
		t.Fatalf("%d cached, want %d", n, maxCached)
	}
	last := "sb-" + strconv.Itoa(maxCached+99)
	if h.sandboxes[last].token != "x" {
		t.Fatal("the newest entry was evicted")
	}
}
