package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// OCI whiteout names.
const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
	whMeta   = ".wh..wh." // other AUFS metadata (.wh..wh.plnk, .wh..wh.aufs)
)

// addTar reads one tar stream into the layer. oci selects OCI layer
// semantics: .wh.NAME becomes an overlay whiteout and .wh..wh..opq marks
// its directory opaque; otherwise (a rootfs tar) such names are plain files.
// Nothing is ever written to disk and no link is followed.
func (b *builder) addTar(r io.Reader, oci bool, what string) error {
	tr := tar.NewReader(r)
	last := "(none)"
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: after entry %q: %w: %w", what, last, truncErr(err), err)
		}
		last = hdr.Name
		if err := b.addTarEntry(tr, hdr, oci, what); err != nil {
			return err
		}
	}
}

func truncErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("truncated or corrupt tar: %w", errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("bad tar: %w", errdefs.ErrInvalidArgument)
}

func (b *builder) addTarEntry(tr *tar.Reader, hdr *tar.Header, oci bool, what string) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil
	}
	p, err := cleanEntryPath(hdr.Name, what)
	if err != nil {
		return err
	}
	if oci {
		base := path.Base(p)
		switch {
		case base == whOpaque:
			b.setOpaque(parentOf(p))
			return nil
		case strings.HasPrefix(base, whMeta):
			return nil
		case strings.HasPrefix(base, whPrefix):
			name := base[len(whPrefix):]
			if name == "" || name == "." || name == ".." {
				return fmt.Errorf("%s: entry %q: bad whiteout name: %w", what, hdr.Name, errdefs.ErrInvalidArgument)
			}
			b.add(&Entry{Path: path.Join(parentOf(p), name), Type: TypeChar, ModTime: hdr.ModTime.UTC()})
			return nil
		}
	}
	e := &Entry{
		Path:    p,
		Mode:    modeFromTar(hdr.Mode),
		UID:     hdr.Uid,
		GID:     hdr.Gid,
		ModTime: hdr.ModTime.UTC(),
		Xattrs:  tarXattrs(hdr),
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		if p == "" {
			return fmt.Errorf("%s: entry %q: the layer root is not a regular file: %w", what, hdr.Name, errdefs.ErrInvalidArgument)
		}
		e.Type, e.Size = TypeReg, hdr.Size
		return b.addReg(e, tr, what)
	case tar.TypeDir:
		e.Type = TypeDir
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return fmt.Errorf("%s: symlink %q: empty target: %w", what, hdr.Name, errdefs.ErrInvalidArgument)
		}
		e.Type, e.Linkname = TypeSymlink, hdr.Linkname
	case tar.TypeLink:
		t, err := cleanEntryPath(hdr.Linkname, what)
		if err != nil {
			return fmt.Errorf("%s: hardlink %q: target %q points outside the layer: %w", what, hdr.Name, hdr.Linkname, errdefs.ErrInvalidArgument)
		}
		return b.addHardlink(e, t, what)
	case tar.TypeChar, tar.TypeBlock:
		if hdr.Typeflag == tar.TypeChar && hdr.Devmajor == 0 && hdr.Devminor == 0 && oci {
			// In overlay form a 0/0 char device is a whiteout; an OCI
			// layer spells whiteouts as .wh. names, so this one is data
			// we cannot represent faithfully.
			b.cfg.log.Warn("dropping 0/0 character device from OCI layer", "entry", hdr.Name)
			return nil
		}
		if !b.cfg.keepDevices {
			b.cfg.log.Info("dropping device node (policy)", "entry", hdr.Name)
			return nil
		}
		e.Type = TypeChar
		if hdr.Typeflag == tar.TypeBlock {
			e.Type = TypeBlock
		}
		e.Devmajor, e.Devminor = hdr.Devmajor, hdr.Devminor
	case tar.TypeFifo:
		e.Type = TypeFifo
	default:
		b.cfg.log.Warn("skipping unsupported tar entry", "entry", hdr.Name, "type", string(hdr.Typeflag))
		return nil
	}
	if p == "" && e.Type != TypeDir {
		return fmt.Errorf("%s: entry %q: the layer root must be a directory: %w", what, hdr.Name, errdefs.ErrInvalidArgument)
	}
	b.add(e)
	return nil
}

func modeFromTar(m int64) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// tarXattrs returns the entry's xattrs, minus trusted.overlay.*: an
// archive must not be able to make a directory opaque or redirect it in
// our overlay form other than through OCI whiteouts.
func tarXattrs(hdr *tar.Header) map[string][]byte {
	var x map[string][]byte
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		if x == nil {
			x = map[string][]byte{}
		}
		x[name] = []byte(v)
	}
	return x
}

// Compression of a stream, by magic number.
const (
	compNone = iota
	compGzip
	compZstd
)

func sniffCompression(head []byte) int {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return compGzip
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return compZstd
	}
	return compNone
}

// decompress returns a reader of r's uncompressed bytes (gzip, zstd or
// plain, detected by magic) and a close function.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, _ := br.Peek(4)
	switch sniffCompression(head) {
	case compGzip:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("gzip: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		return zr, func() { zr.Close() }, nil
	case compZstd:
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("zstd: %w: %w", errdefs.ErrInvalidArgument, err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}
