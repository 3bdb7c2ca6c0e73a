// Package rootfs lays out a sandbox's root file system on the host: the
// overlay spec (read-only lower layers, a private upper and work dir) and,
// when the sandbox has a disk limit, a sparse ext4 image on a loop device
// that holds upper and work.
//
// It returns data, it does not mount: the runtime's init mounts the disk and
// the overlay inside the sandbox's own mount namespace, so the host's mount
// table never grows with the number of sandboxes.
//
// Disk limits: the kernel here has no quota support usable for project
// quotas, so a limit means a file system of that size. mkfs per sandbox is
// far too slow for a fast create, so a DiskPool keeps a few pre-formatted
// sparse images per size and refills in the background. DiskBytes == 0
// means no separate file system: the upper lives on the data directory's
// file system and is bounded only by it.
package rootfs
