package runtime_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func procField(t *testing.T, path, key string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("%s: no %s", path, key)
	return ""
}

// TestInitIsNotGo checks that the init runs the C shim only: a Go runtime
// would have started several threads and a large heap.
func TestInitIsNotGo(t *testing.T) {
	e := newEnv(t)
	st := e.create("foot1")
	pid := strconv.Itoa(st.Pid)
	if th := procField(t, "/proc/"+pid+"/status", "Threads"); th != "1" {
		t.Fatalf("init has %s threads, want 1 (Go runtime started?)", th)
	}
	pss := procField(t, "/proc/"+pid+"/smaps_rollup", "Pss")
	rss := procField(t, "/proc/"+pid+"/smaps_rollup", "Rss")
	anon := procField(t, "/proc/"+pid+"/smaps_rollup", "Anonymous")
	t.Logf("init footprint: Rss %s, Pss %s, Anonymous %s", rss, pss, anon)
	kb, _ := strconv.Atoi(strings.Fields(anon)[0])
	if kb > 1024 {
		t.Fatalf("init has %d kB of private anonymous memory, want < 1 MiB", kb)
	}
}
