// Package lazyfs serves image layers as lazily fetched, read-only FUSE file
// systems shared by every sandbox on a node.
//
// One FUSE mount per layer per node (Mounter.Acquire, reference counted)
// lives at <root>/<hex digest>; rootfs stacks these mounts as overlayfs
// lowerdirs, so all sandboxes of an image share one kernel page cache copy
// of every file. The whole tree (the layer index, already in overlayfs form:
// 0/0 char devices are whiteouts, trusted.overlay.opaque marks opaque dirs)
// is built in memory at mount time; the kernel may cache entries, attributes
// and negative lookups for a long time because a layer never changes, and
// keeps directory listings and symlink targets in its page cache.
// Directories are opened without a round trip (OPENDIR answered ENOSYS,
// see rawLayer) and files are closed without FLUSH, so a repeated walk of
// a tree (find, ls -lR, an import scanning sys.path) never reaches the
// daemon.
//
// File data is fetched on first read, chunk by chunk, into a ChunkCache: a
// bounded on-disk LRU of verified chunks shared by all layers of the node.
// Concurrent misses for one chunk share one fetch; store errors are retried
// a bounded number of times, then the read fails with EIO. Every chunk is
// verified against its sha256 before it is served or cached: a corrupt chunk
// is an EIO and a log line naming the chunk and layer, never wrong data. When
// nothing can be evicted the chunk is served from memory without caching.
//
// I/O modes. The first open of a file in a mount decides its mode for the
// life of that mount, so the kernel never holds two page cache copies of it:
// a file whose chunks are all cached at that point is opened in FUSE
// passthrough mode (kernel >= 6.9) backed by a whole-file copy in the cache
// (a single-chunk file's chunk file is used as is); any other file is read
// through the daemon with FOPEN_KEEP_CACHE, 1 MiB at a time.
//
// Prefetch: the files a mount reads during its first PrefetchWindow are
// recorded once per layer (a small JSON list in the node dir, or any
// PrefetchLists); when the layer is mounted again later their chunks are
// fetched in the background with bounded concurrency, like stargz's landmark
// and nydus's prefetch list.
//
// Lifetime: the last release of a layer unmounts it after a grace period
// (WithGracePeriod; 0 unmounts at once) so short gaps between sandboxes do
// not drop the page cache; Close unmounts everything (lazily if busy). An
// overlay still stacked on a released layer holds its own clone of the
// mount and keeps being served until it is unmounted; a layer with files
// open directly on it stays mounted (and is logged) until Close.
//
// The daemon runs inside the caller's process, so that process must never
// page-fault on a lazyfs file (mmap) nor exec a lazyfs binary from a
// vfork child (os/exec with Chroot into a sandbox root): the faulting or
// vforking thread cannot be stopped by the Go garbage collector while it
// waits for the daemon, and the daemon waits for the collector. Start
// sandbox processes through a binary on the host disk (a re-exec'd init
// shim, chroot(8)) and read layer files with read(2) only.
//
// Stats (bytes of the image, fetched from the store, served to the kernel,
// chunk hits/misses, time spent waiting for fetches) are kept per layer and
// summed per caller-chosen image key; Collector exports them to Prometheus.
// Reads served from the page cache or by passthrough never reach the daemon
// and are not counted as read bytes.
package lazyfs
