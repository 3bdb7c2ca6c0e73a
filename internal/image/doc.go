// Package image turns images (OCI layouts, docker archives, rootfs
// directories and tars) into dsec's storage format and keeps named,
// versioned images.
//
// Storage format: a layer is a small JSON index (tree, attributes, per-file
// chunk lists) plus data chunks of 1-4 MiB, each a blob named by the sha256
// of its uncompressed bytes, optionally stored zstd-compressed. Chunks are
// shared across layers and images. A layer index is stored already in
// overlayfs form: an OCI whiteout becomes a 0/0 character device and an
// opaque directory carries trusted.overlay.opaque=y, so a mounted layer is
// directly usable as an overlay lowerdir. An image version is a named list
// of layer digests (bottom first).
package image
