// Package image turns images (OCI layouts, OCI and docker archives,
// registries, rootfs directories and tars, overlay upper directories) into
// dsec's storage format and keeps named, versioned images.
//
// # Storage format
//
// A layer is a small index (index.go: tree, attributes, per-file chunk
// lists; stored as one zstd frame of JSON, its blob digest being the
// layer's identity) plus data chunks. Regular files are cut at multiples
// of the chunk size (1 MiB by default, 1-4 MiB); each chunk is a blob
// named by the sha256 of its uncompressed bytes, or, when zstd saves at
// least 1/16, the blob named Chunk.Stored holds one zstd frame of it.
// All-zero blocks and holes are stored as no chunk, so sparse files stay
// sparse and ranges without a chunk read as zeros. Chunks are shared
// across files, layers and images by digest; fixed boundaries keep a file
// changed in place sharing its unchanged chunks. Everything read back is
// verified: ReadIndex and ReadChunk check digests, and Index.Validate the
// invariants readers (lazyfs, Unpack) rely on.
//
// The index is in overlayfs form: an OCI whiteout .wh.NAME becomes a 0/0
// character device NAME and .wh..wh..opq becomes
// trusted.overlay.opaque=y on its directory, so a layer materialised by a
// LayerProvider (Unpack here, FUSE in lazyfs) is directly an overlay
// lowerdir, and an overlay upper directory is committed as is (CommitDir).
//
// # Versions
//
// An image version is a Manifest blob (layers bottom-first, config,
// parent); a MetaStore maps NAME:TAG to a manifest digest. Changing one
// layer writes a new manifest sharing every other layer. NAME@sha256:...
// resolves any version still stored. GC marks from every tag plus what the
// caller says is in use, and sweeps the rest, sparing recent blobs.
//
// # Import safety
//
// Archives are never extracted to disk on import: entries are turned into
// index entries, so no symlink or hardlink is ever followed. Absolute
// names, names escaping with .., hardlinks to outside, to directories or to
// missing targets, entries below non-directories, truncated archives and
// wrong digests are refused with errdefs.ErrInvalidArgument naming the
// entry, before any tag changes. Device nodes are dropped unless
// WithKeepDevices; setuid bits, owners and xattrs (security.capability)
// are kept, trusted.overlay.* from archives is not.
package image
