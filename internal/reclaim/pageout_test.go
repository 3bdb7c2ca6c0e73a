package reclaim

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"reflect"
	"testing"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func TestParseMaps(t *testing.T) {
	in := `55d0c0a00000-55d0c0a28000 r--p 00000000 fe:01 1835049                    /usr/bin/sleep
55d0c1e6e000-55d0c1e8f000 rw-p 00000000 00:00 0                          [heap]
7f1c2a400000-7f1c2a600000 rw-p 00000000 00:00 0 
7f1c2a600000-7f1c2a628000 r--p 00000000 fe:01 1837 /lib/x86_64-linux-gnu/my lib.so (deleted)
7ffd1e3f0000-7ffd1e411000 rw-p 00000000 00:00 0                          [stack]
7ffd1e5c8000-7ffd1e5cc000 r--p 00000000 00:00 0                          [vvar]
7ffd1e5cc000-7ffd1e5ce000 r-xp 00000000 00:00 0                          [vdso]
7f00000000-7f00001000 rw-p 00000000 00:00 0                              [anon:go heap]
`
	got, err := ParseMaps("maps", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	type kind struct{ anon, file, out bool }
	want := []struct {
		m Mapping
		k kind
	}{
		{Mapping{0x55d0c0a00000, 0x55d0c0a28000, "r--p", 1835049, "/usr/bin/sleep"}, kind{false, true, true}},
		{Mapping{0x55d0c1e6e000, 0x55d0c1e8f000, "rw-p", 0, "[heap]"}, kind{true, false, true}},
		{Mapping{0x7f1c2a400000, 0x7f1c2a600000, "rw-p", 0, ""}, kind{true, false, true}},
		{Mapping{0x7f1c2a600000, 0x7f1c2a628000, "r--p", 1837, "/lib/x86_64-linux-gnu/my lib.so (deleted)"}, kind{false, true, true}},
		{Mapping{0x7ffd1e3f0000, 0x7ffd1e411000, "rw-p", 0, "[stack]"}, kind{true, false, true}},
		{Mapping{0x7ffd1e5c8000, 0x7ffd1e5cc000, "r--p", 0, "[vvar]"}, kind{false, false, false}},
		{Mapping{0x7ffd1e5cc000, 0x7ffd1e5ce000, "r-xp", 0, "[vdso]"}, kind{false, false, false}},
		{Mapping{0x7f00000000, 0x7f00001000, "rw-p", 0, "[anon:go heap]"}, kind{true, false, true}},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d mappings, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if !reflect.DeepEqual(got[i], w.m) {
			t.Errorf("mapping %d = %+v, want %+v", i, got[i], w.m)
		}
		if k := (kind{got[i].Anon(), got[i].File(), got[i].pageoutable()}); k != w.k {
			t.Errorf("mapping %d (%s) kind %+v, want %+v", i, got[i].Path, k, w.k)
		}
	}
	for _, bad := range []string{
		"55d0c0a00000 r--p 00000000 fe:01 1835049 /x\n",
		"zz-55d0c0a28000 r--p 00000000 fe:01 1835049 /x\n",
		"2000-1000 r--p 00000000 fe:01 1835049 /x\n",
		"1000-2000 r--p 00000000 fe:01 inode /x\n",
		"1000-2000 r--p\n",
	} {
		if _, err := ParseMaps("maps", []byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v, want invalid argument", bad, err)
		}
	}
}

func TestPageoutBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := Pageout(ctx, []int{os.Getpid()}, PageoutKinds{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("no kinds: %v", err)
	}
	// A process that has exited is counted as gone, not an error.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	res, err := Pageout(ctx, []int{cmd.Process.Pid}, PageoutKinds{File: true})
	if err != nil || res.Gone != 1 || res.Processes != 0 {
		t.Fatalf("exited pid: %+v, %v", res, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Pageout(cancelled, []int{os.Getpid()}, PageoutKinds{File: true}); !errors.Is(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}

// Without swap: a process's mapped file pages go out, it still works, and
// they come back when touched.
func TestPageoutFileV1(t *testing.T) {
	g := v1Group(t, cgroups.Resources{MemoryLimit: 1 << 30})
	file := diskFile(t, int(32*mib))
	h := startHelper(t, g, "MMAP_FILE="+file)
	before, err := ReadProcMemory(h.pid())
	if err != nil {
		t.Fatal(err)
	}
	if before.RssFile < 32*mib {
		t.Fatalf("RssFile before = %d MiB, want >= 32", before.RssFile>>20)
	}
	gb, _ := g.Stats()
	res, err := Pageout(context.Background(), []int{h.pid()}, PageoutKinds{File: true})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := ReadProcMemory(h.pid())
	ga, _ := g.Stats()
	t.Logf("pageout %+v: RssFile %d -> %d MiB, group file %d -> %d MiB", res, before.RssFile>>20, after.RssFile>>20, gb.File>>20, ga.File>>20)
	if res.Processes != 1 || res.Bytes < 32*mib {
		t.Errorf("result %+v", res)
	}
	if drop := before.RssFile - after.RssFile; drop < 28*mib {
		t.Errorf("RssFile dropped by %d MiB, want >= 28", drop>>20)
	}
	if drop := int64(gb.File) - int64(ga.File); drop < 28*mib {
		t.Errorf("group page cache dropped by %d MiB, want >= 28", drop>>20)
	}
	h.send(t, "touchfile")
	h.expect(t, "ok")
	back, _ := ReadProcMemory(h.pid())
	if back.RssFile < 32*mib {
		t.Errorf("RssFile after touching again = %d MiB", back.RssFile>>20)
	}
}

// With zram swap: an idle process's anon memory goes out to swap, RSS
// falls, and the data is intact when the process next reads it.
func TestPageoutAnonV1WithZram(t *testing.T) {
	g := v1Group(t, cgroups.Resources{MemoryLimit: 1 << 30})
	zramSwap(t, 256*mib)
	h := startHelper(t, g, "ALLOC_MIB=64")
	before, err := ReadProcMemory(h.pid())
	if err != nil {
		t.Fatal(err)
	}
	res, err := Pageout(context.Background(), []int{h.pid()}, PageoutKinds{Anon: true})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := ReadProcMemory(h.pid())
	st, _ := g.Stats()
	t.Logf("pageout %+v: RssAnon %d -> %d MiB, swap %d MiB, group swap %d MiB", res, before.RssAnon>>20, after.RssAnon>>20, after.Swap>>20, st.Swap>>20)
	if drop := before.RssAnon - after.RssAnon; drop < 56*mib {
		t.Errorf("RssAnon dropped by %d MiB, want >= 56", drop>>20)
	}
	if after.Swap < 56*mib || int64(st.Swap) < 56*mib {
		t.Errorf("swap: process %d MiB, group %d MiB, want >= 56", after.Swap>>20, st.Swap>>20)
	}
	h.send(t, "check")
	h.expect(t, "ok")
	back, _ := ReadProcMemory(h.pid())
	if back.RssAnon < 64*mib {
		t.Errorf("RssAnon after reading the data = %d MiB, want >= 64", back.RssAnon>>20)
	}
}
