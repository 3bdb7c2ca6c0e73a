package rootfs

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Loop is an attached loop device with LO_FLAGS_AUTOCLEAR: the kernel
// detaches it when the last opener (our fd or a mount) goes away.
type Loop struct {
	f    *os.File
	Path string
}

// AttachLoop binds image to a free loop device.
func AttachLoop(image string) (*Loop, error) {
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open loop control: %w", err)
	}
	defer ctl.Close()
	// Another attach may race us for the same free device: retry on EBUSY.
	for range 64 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find free loop device: %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		dev, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err != nil && errors.Is(err, unix.EINVAL) {
			// Direct I/O needs an aligned backing file system.
			cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
			err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		}
		if err == nil {
			return &Loop{f: dev, Path: path}, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configure %s: %w", path, err)
		}
	}
	return nil, fmt.Errorf("no free loop device after retries: %w", unix.EBUSY)
}

// Close drops our reference.
func (l *Loop) Close() error { return l.f.Close() }
