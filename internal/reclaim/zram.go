package reclaim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// SwapSpec is the node's compressed swap tier as given to `dsec serve
// --swap`: "" / "off" (none, the default) or "zram:SIZE[:ALGO]".
type SwapSpec struct {
	Kind      string // "" (off) or "zram"
	Size      int64
	Algorithm string // "" = kernel default
	Priority  int    // swap priority, higher is used first
}

// ParseSwapSpec parses "zram:4G", "zram:512M:lz4", "off" or "". Sizes take
// K, M, G, T (binary) suffixes, with an optional "iB"/"B".
func ParseSwapSpec(s string) (SwapSpec, error) {
	if s == "" || s == "off" || s == "none" {
		return SwapSpec{}, nil
	}
	parts := strings.Split(s, ":")
	if parts[0] != "zram" || len(parts) < 2 || len(parts) > 3 {
		return SwapSpec{}, fmt.Errorf("reclaim: swap spec %q: want zram:SIZE[:ALGO] or off: %w", s, errdefs.ErrInvalidArgument)
	}
	size, err := ParseSize(parts[1])
	if err != nil {
		return SwapSpec{}, fmt.Errorf("reclaim: swap spec %q: %w", s, err)
	}
	if size < 1<<20 {
		return SwapSpec{}, fmt.Errorf("reclaim: swap spec %q: size below 1 MiB: %w", s, errdefs.ErrInvalidArgument)
	}
	spec := SwapSpec{Kind: "zram", Size: size, Priority: 100}
	if len(parts) == 3 {
		if parts[2] == "" {
			return SwapSpec{}, fmt.Errorf("reclaim: swap spec %q: empty algorithm: %w", s, errdefs.ErrInvalidArgument)
		}
		spec.Algorithm = parts[2]
	}
	return spec, nil
}

// ParseSize parses "123", "64K", "512M", "4G", "1T" (binary units; "KiB",
// "MB" etc. accepted).
func ParseSize(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(s), "B"), "I")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v <= 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("reclaim: size %q: %w", s, errdefs.ErrInvalidArgument)
	}
	return v * mult, nil
}

// Zram is one zram swap device set up by SetupZram.
type Zram struct {
	ID        int
	Device    string // /dev/zramN
	Size      int64
	Algorithm string

	sysfs      string // /sys
	madeNode   bool
	swappedOn  bool
	log        *slog.Logger
	controlDir string
}

// ZramAvailable reports whether zram devices can be added (zram built in or
// loaded: /sys/class/zram-control exists).
func ZramAvailable(sysfs string) bool {
	_, err := os.Stat(filepath.Join(sysfs, "class/zram-control/hot_add"))
	return err == nil
}

// SetupZram creates a new zram device (never touching existing ones),
// sizes it, writes a swap header and enables it as swap with spec.Priority.
// On failure everything done so far is undone. sysfs is normally "/sys"
// and dev "/dev".
func SetupZram(ctx context.Context, log *slog.Logger, sysfs, dev string, spec SwapSpec) (_ *Zram, err error) {
	if spec.Kind != "zram" || spec.Size <= 0 {
		return nil, fmt.Errorf("reclaim: zram setup needs a zram spec with a size, got %+v: %w", spec, errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	control := filepath.Join(sysfs, "class/zram-control")
	if !ZramAvailable(sysfs) {
		return nil, fmt.Errorf("reclaim: zram not available (no %s; CONFIG_ZRAM off or module not loaded): %w", control, errdefs.ErrNotImplemented)
	}
	// Reading hot_add allocates a fresh device and returns its number.
	b, err := os.ReadFile(filepath.Join(control, "hot_add"))
	if err != nil {
		return nil, fmt.Errorf("reclaim: zram hot_add: %w", err)
	}
	id, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("reclaim: zram hot_add returned %q: %w", b, errdefs.ErrInvalidArgument)
	}
	z := &Zram{ID: id, Device: filepath.Join(dev, "zram"+strconv.Itoa(id)), Size: spec.Size, sysfs: sysfs, log: log, controlDir: control}
	defer func() {
		if err != nil {
			if cerr := z.Close(); cerr != nil {
				log.Error("reclaim: undo zram setup", "device", z.Device, "err", cerr)
			}
		}
	}()
	blk := z.blockDir()
	if spec.Algorithm != "" {
		if err := writeSys(blk, "comp_algorithm", spec.Algorithm); err != nil {
			avail, _ := os.ReadFile(filepath.Join(blk, "comp_algorithm"))
			return nil, fmt.Errorf("reclaim: zram algorithm %q (available: %s): %w", spec.Algorithm, strings.TrimSpace(string(avail)), err)
		}
	}
	if alg, rerr := os.ReadFile(filepath.Join(blk, "comp_algorithm")); rerr == nil {
		z.Algorithm = currentChoice(string(alg))
	}
	if err := writeSys(blk, "disksize", strconv.FormatInt(spec.Size, 10)); err != nil {
		return nil, fmt.Errorf("reclaim: zram disksize: %w", err)
	}
	if err := z.ensureNode(ctx); err != nil {
		return nil, err
	}
	if err := writeSwapHeader(z.Device, spec.Size); err != nil {
		return nil, err
	}
	flags := uintptr(0)
	if spec.Priority >= 0 {
		const swapFlagPrefer, swapFlagPrioMask = 0x8000, 0x7fff
		flags = swapFlagPrefer | uintptr(spec.Priority&swapFlagPrioMask)
	}
	if err := swapctl(unix.SYS_SWAPON, z.Device, flags); err != nil {
		return nil, fmt.Errorf("reclaim: swapon %s: %w", z.Device, err)
	}
	z.swappedOn = true
	log.Info("reclaim: zram swap on", "device", z.Device, "size", spec.Size, "algorithm", z.Algorithm, "priority", spec.Priority)
	return z, nil
}

func (z *Zram) blockDir() string {
	return filepath.Join(z.sysfs, "block", "zram"+strconv.Itoa(z.ID))
}

// ensureNode waits briefly for devtmpfs to create /dev/zramN, and makes the
// node itself when there is no devtmpfs.
func (z *Zram) ensureNode(ctx context.Context) error {
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(z.Device); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("reclaim: waiting for %s: %w: %w", z.Device, ctx.Err(), errdefs.ErrDeadlineExceeded)
		case <-time.After(2 * time.Millisecond):
		}
	}
	b, err := os.ReadFile(filepath.Join(z.blockDir(), "dev"))
	if err != nil {
		return fmt.Errorf("reclaim: zram dev number: %w", err)
	}
	maj, min, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	ma, err1 := strconv.ParseUint(maj, 10, 32)
	mi, err2 := strconv.ParseUint(min, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("reclaim: zram dev number %q: %w", b, errdefs.ErrInvalidArgument)
	}
	if err := unix.Mknod(z.Device, unix.S_IFBLK|0o600, int(unix.Mkdev(uint32(ma), uint32(mi)))); err != nil {
		return fmt.Errorf("reclaim: mknod %s: %w", z.Device, err)
	}
	z.madeNode = true
	return nil
}

// writeSwapHeader writes what mkswap writes: a version-1 swap header in the
// first page with the "SWAPSPACE2" signature at its end. Doing it here
// avoids depending on util-linux.
func writeSwapHeader(device string, size int64) error {
	page := int64(os.Getpagesize())
	lastPage := size/page - 1
	if lastPage < 10 || lastPage > 1<<32-1 {
		return fmt.Errorf("reclaim: swap size %d out of range: %w", size, errdefs.ErrInvalidArgument)
	}
	hdr := make([]byte, page)
	// union swap_header: 1024 bytes of boot bits, then version, last_page,
	// nr_badpages, uuid[16], volume_name[16].
	binary.NativeEndian.PutUint32(hdr[1024:], 1)
	binary.NativeEndian.PutUint32(hdr[1028:], uint32(lastPage))
	binary.NativeEndian.PutUint32(hdr[1032:], 0)
	if _, err := readRandom(hdr[1036 : 1036+16]); err != nil {
		return err
	}
	hdr[1036+6] = hdr[1036+6]&0x0f | 0x40 // UUID v4
	hdr[1036+8] = hdr[1036+8]&0x3f | 0x80
	copy(hdr[1052:], "dsec-zram")
	copy(hdr[page-10:], "SWAPSPACE2")
	f, err := os.OpenFile(device, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reclaim: open %s: %w", device, err)
	}
	defer f.Close()
	if _, err := f.WriteAt(hdr, 0); err != nil {
		return fmt.Errorf("reclaim: write swap header to %s: %w", device, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("reclaim: sync %s: %w", device, err)
	}
	return nil
}

func readRandom(b []byte) (int, error) {
	n, err := unix.Getrandom(b, 0)
	if err != nil {
		return n, fmt.Errorf("reclaim: getrandom: %w", err)
	}
	return n, nil
}

func swapctl(nr uintptr, path string, flags uintptr) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall(nr, uintptr(unsafe.Pointer(p)), flags, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Close turns swap off (the kernel pulls every swapped page back into
// RAM first, so this can take a while and fails with ENOMEM if RAM is
// short), resets the device and removes it. Safe to call on a partly set
// up device.
func (z *Zram) Close() error {
	var errs []error
	if z.swappedOn {
		if err := swapctl(unix.SYS_SWAPOFF, z.Device, 0); err != nil {
			// Keep the device: its pages are still in use as swap.
			return fmt.Errorf("reclaim: swapoff %s: %w", z.Device, err)
		}
		z.swappedOn = false
	}
	blk := z.blockDir()
	if _, err := os.Stat(blk); err == nil {
		if err := writeSys(blk, "reset", "1"); err != nil {
			errs = append(errs, fmt.Errorf("reclaim: zram reset: %w", err))
		}
		if err := writeSys(z.controlDir, "hot_remove", strconv.Itoa(z.ID)); err != nil {
			errs = append(errs, fmt.Errorf("reclaim: zram hot_remove: %w", err))
		}
	}
	if z.madeNode {
		if err := os.Remove(z.Device); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		z.madeNode = false
	}
	if len(errs) == 0 {
		z.log.Info("reclaim: zram swap removed", "device", z.Device)
	}
	return errors.Join(errs...)
}

// Stats reads the device's mm_stat: original and compressed bytes stored,
// and the memory the pool uses.
func (z *Zram) Stats() (orig, compr, used int64, err error) {
	b, err := os.ReadFile(filepath.Join(z.blockDir(), "mm_stat"))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("reclaim: zram mm_stat: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0, 0, 0, fmt.Errorf("reclaim: zram mm_stat %q: %w", b, errdefs.ErrInvalidArgument)
	}
	var v [3]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("reclaim: zram mm_stat %q: %w", b, errdefs.ErrInvalidArgument)
		}
	}
	return v[0], v[1], v[2], nil
}

// ZswapEnabled reports whether zswap is built in and enabled.
func ZswapEnabled(sysfs string) (present, enabled bool) {
	b, err := os.ReadFile(filepath.Join(sysfs, "module/zswap/parameters/enabled"))
	if err != nil {
		return false, false
	}
	return true, strings.TrimSpace(string(b)) == "Y"
}

// currentChoice picks the bracketed entry of a sysfs choice list
// ("lzo [lzo-rle] lz4").
func currentChoice(s string) string {
	for _, f := range strings.Fields(s) {
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			return strings.Trim(f, "[]")
		}
	}
	return ""
}

func writeSys(dir, file, v string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", v, filepath.Join(dir, file), err)
	}
	return nil
}
