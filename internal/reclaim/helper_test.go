package reclaim

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/cgroups"
	"github.com/dsec-dev/dsec/internal/testutil"
)

// The test binary doubles as the workload: with DSEC_RECLAIM_HELPER set it
// runs helperMain instead of the tests, so the memory it holds is known
// exactly.
func TestMain(m *testing.M) {
	if os.Getenv("DSEC_RECLAIM_HELPER") == "1" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

const pageSize = 4096

// helperMain waits for "go" on stdin (so the parent can first move it into
// a cgroup), then:
//   - MERGE=1: opts into KSM (PR_SET_MEMORY_MERGE);
//   - EXEC=path: execs path (to check the KSM flag survives execve);
//   - ALLOC_MIB=n: allocates n MiB of anon memory and writes every page
//     (distinct content per page, or identical with SAME=1);
//   - READ_FILE=path: reads the file through a small buffer (page cache);
//   - MMAP_FILE=path: maps the file privately and reads every page;
//
// prints "ready", then answers "check" (verify the anon data: "ok"/"bad")
// and "touchfile" (read the mapped file again: "ok") until stdin closes.
func helperMain() int {
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return 2
	}
	if os.Getenv("MERGE") == "1" {
		if err := EnableMemoryMergeSelf(); err != nil {
			fmt.Println("error", err)
			return 3
		}
	}
	if path := os.Getenv("EXEC"); path != "" {
		err := syscall.Exec(path, []string{path, "1000"}, os.Environ())
		fmt.Println("error", err)
		return 3
	}
	var anon []byte
	same := os.Getenv("SAME") == "1"
	if n, _ := strconv.Atoi(os.Getenv("ALLOC_MIB")); n > 0 {
		// mmap directly rather than make(): the Go heap would add its own
		// slack and could be scavenged under us.
		var err error
		anon, err = unix.Mmap(-1, 0, n<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			fmt.Println("error", err)
			return 3
		}
		fill(anon, same)
	}
	if path := os.Getenv("READ_FILE"); path != "" {
		f, err := os.Open(path)
		if err != nil {
			fmt.Println("error", err)
			return 3
		}
		_, _ = io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, make([]byte, 64<<10))
		f.Close()
	}
	var mapped []byte
	if path := os.Getenv("MMAP_FILE"); path != "" {
		f, err := os.Open(path)
		if err != nil {
			fmt.Println("error", err)
			return 3
		}
		st, _ := f.Stat()
		mapped, err = unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_PRIVATE)
		f.Close()
		if err != nil {
			fmt.Println("error", err)
			return 3
		}
		touch(mapped)
	}
	fmt.Println("ready")
	for in.Scan() {
		switch in.Text() {
		case "check":
			if verify(anon, same) {
				fmt.Println("ok")
			} else {
				fmt.Println("bad")
			}
		case "touchfile":
			touch(mapped)
			fmt.Println("ok")
		}
	}
	return 0
}

var sink byte

func touch(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		sink += b[i]
	}
}

func pageWord(i int, same bool) uint64 {
	if same {
		return 0x5a5a5a5a5a5a5a5a
	}
	return uint64(i)*0x9e3779b97f4a7c15 | 1
}

func fill(b []byte, same bool) {
	for p := 0; p*pageSize < len(b); p++ {
		page := b[p*pageSize : (p+1)*pageSize]
		w := pageWord(p, same)
		for off := 0; off < pageSize; off += 8 {
			binary.LittleEndian.PutUint64(page[off:], w+uint64(off))
		}
	}
}

func verify(b []byte, same bool) bool {
	for p := 0; p*pageSize < len(b); p++ {
		page := b[p*pageSize : (p+1)*pageSize]
		w := pageWord(p, same)
		for off := 0; off < pageSize; off += 8 {
			if binary.LittleEndian.Uint64(page[off:]) != w+uint64(off) {
				return false
			}
		}
	}
	return true
}

// helper is a running helper process.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// startHelper starts the helper with env, moves it into g (if not nil),
// lets it go and waits for "ready". It is killed at cleanup.
func startHelper(t *testing.T, g cgroups.Group, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"DSEC_RECLAIM_HELPER=1"}, env...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	h := &helper{cmd: cmd, in: in, out: bufio.NewScanner(outR)}
	if g != nil {
		if err := g.AddProc(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
	}
	h.send(t, "go")
	if !hasEnv(env, "EXEC=") { // an exec'd program says nothing
		h.expect(t, "ready")
	}
	return h
}

func hasEnv(env []string, prefix string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

func (h *helper) pid() int { return h.cmd.Process.Pid }

func (h *helper) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(h.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (h *helper) expect(t *testing.T, want string) {
	t.Helper()
	done := make(chan bool, 1)
	go func() { done <- h.out.Scan() }()
	select {
	case ok := <-done:
		if !ok || h.out.Text() != want {
			t.Fatalf("helper said %q (%v), want %q", h.out.Text(), h.out.Err(), want)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("helper did not say %q within 60s", want)
	}
}

// v1Group creates a real v1 group for the test and removes it (killing
// what is left in it) at cleanup.
func v1Group(t *testing.T, r cgroups.Resources) cgroups.Group {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "cgroup v1 memory hierarchy", isDir("/sys/fs/cgroup/memory") && !isFile("/sys/fs/cgroup/cgroup.controllers"))
	m, err := cgroups.NewV1("/sys/fs/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "dsec-reclaim-test-" + hex.EncodeToString(b)
	ctx := context.Background()
	g, err := m.New(ctx, name, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := g.Kill(ctx); err != nil {
			t.Errorf("cleanup kill: %v", err)
		}
		if err := g.Delete(ctx); err != nil {
			t.Errorf("cleanup delete: %v", err)
		}
	})
	return g
}

func isDir(p string) bool  { st, err := os.Stat(p); return err == nil && st.IsDir() }
func isFile(p string) bool { st, err := os.Stat(p); return err == nil && !st.IsDir() }

// diskFile writes a file of size bytes on a disk file system (not tmpfs,
// whose pages are shmem) and evicts it from the page cache, so the next
// reader is charged for it.
func diskFile(t *testing.T, size int) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "dsec-reclaim-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "data")
	buf := make([]byte, size)
	_, _ = rand.Read(buf)
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	return p
}

// zramSwap sets up a zram swap device for the test and tears it down.
func zramSwap(t *testing.T, size int64) *Zram {
	t.Helper()
	testutil.RequiresRoot(t)
	testutil.RequiresFeature(t, "zram (CONFIG_ZRAM)", ZramAvailable("/sys"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	z, err := SetupZram(ctx, nil, "/sys", "/dev", SwapSpec{Kind: "zram", Size: size, Priority: 100})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := z.Close(); err != nil {
			t.Errorf("zram teardown: %v", err)
		}
	})
	return z
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
