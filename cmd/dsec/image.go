package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

func newImageCmd(a *app) *cobra.Command {
	cmd := group("image", "Import and manage images", "images", "img")
	cmd.AddCommand(newImageImportCmd(a), newImageLsCmd(a), newImageInspectCmd(a), newImageRmCmd(a),
		newImageGCCmd(a), newImageStatsCmd(a), newImagePullCmd(a))
	return cmd
}

func newImageImportCmd(a *app) *cobra.Command {
	var public, upload, progress bool
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "import NAME[:TAG] PATH",
		Short: "Import an image from an OCI layout, OCI/docker archive, rootfs dir or rootfs tar",
		Long: `Import an image. When the server runs on this host (unix socket) it reads
PATH itself, which is fastest; otherwise, or with --upload, PATH is streamed
to the server (a directory as a tar of its contents, a file as is).
Progress (bytes, layers, rate) goes to stderr on a terminal or with --progress.`,
		Args: exactArgs(2, "an image NAME[:TAG] and a PATH"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, path := args[0], args[1]
			abs, err := filepath.Abs(path)
			if err != nil {
				return err
			}
			st, err := os.Stat(abs)
			if err != nil {
				return fmt.Errorf("import %s: %w", ref, err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p := newProgress(a, progress || a.tty)
			defer p.done()
			var img *client.ImageInfo
			if c.Local() && !upload {
				img, err = c.ImportImageFromPath(cmd.Context(), ref, abs, public, p.server)
			} else {
				img, err = uploadImage(cmd.Context(), c, ref, abs, st, public, p)
			}
			if err != nil {
				return err
			}
			p.done()
			if asJSON {
				return printJSON(a.stdout, img)
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&public, "public", false, "make the image usable by every tenant")
	cmd.Flags().BoolVar(&upload, "upload", false, "stream PATH to the server even when it is local")
	cmd.Flags().BoolVar(&progress, "progress", false, "show progress even when stderr is not a terminal")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the image as JSON")
	return cmd
}

// uploadImage streams a file as is, or a directory as a tar built on the
// fly (no temporary copy of a possibly huge tree).
func uploadImage(ctx context.Context, c *client.Client, ref, path string, st os.FileInfo, public bool, p *progress) (*client.ImageInfo, error) {
	if !st.IsDir() {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return c.ImportImage(ctx, ref, p.count(f), public, p.server)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(ctx, pw, path)) }()
	defer pr.Close() // stops the tar writer if the server gave up early
	return c.ImportImage(ctx, ref, p.count(pr), public, p.server)
}

// writeTar writes dir's contents (not dir itself) with modes, owners and
// symlinks preserved; sockets are skipped as tar cannot hold them.
func writeTar(ctx context.Context, w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.Mode()&fs.ModeSocket != 0 {
			return nil
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", "" // numeric ids are what the rootfs needs
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, info.Size()); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// progress shows import progress on stderr: a self-rewriting line on a
// terminal, one line per second otherwise.
type progress struct {
	a       *app
	on      bool
	start   time.Time
	sent    atomic.Int64
	last    time.Time
	printed bool
	ended   bool
}

func newProgress(a *app, on bool) *progress {
	return &progress{a: a, on: on, start: time.Now()}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func (p *progress) count(r io.Reader) io.Reader { return countingReader{r, &p.sent} }

func (p *progress) server(ip client.ImportProgress) {
	if !p.on || p.ended {
		return
	}
	now := time.Now()
	if !ip.Done && now.Sub(p.last) < 200*time.Millisecond && p.printed {
		return
	}
	if !p.a.tty && !ip.Done && now.Sub(p.last) < time.Second {
		return
	}
	p.last = now
	line := fmt.Sprintf("layer %d/%d  %s  %s/s", ip.Layer, ip.Layers, formatSize(ip.Bytes), formatSize(ip.BytesPerSec))
	if sent := p.sent.Load(); sent > 0 {
		line += fmt.Sprintf("  (uploaded %s)", formatSize(sent))
	}
	line += fmt.Sprintf("  %s", time.Since(p.start).Round(100*time.Millisecond))
	if p.a.tty {
		fmt.Fprintf(p.a.stderr, "\r\033[K%s", line)
	} else {
		fmt.Fprintln(p.a.stderr, line)
	}
	p.printed = true
}

func (p *progress) done() {
	if p.ended {
		return
	}
	p.ended = true
	if p.on && p.printed && p.a.tty {
		fmt.Fprintln(p.a.stderr)
	}
}

func newImageLsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			imgs, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if imgs == nil {
					imgs = []client.ImageInfo{}
				}
				return printJSON(a.stdout, imgs)
			}
			now := time.Now()
			t := newTable(a.stdout, "NAME", "DIGEST", "LAYERS", "SIZE", "OWNER", "PUBLIC", "CREATED")
			for _, img := range imgs {
				t.row(img.Name, shortDigest(img.Digest), len(img.Layers), formatSize(img.Size), orDash(img.Owner), img.Public, age(img.CreatedAt, now))
			}
			return t.flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

func newImageInspectCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect REF",
		Short: "Show an image's details",
		Args:  exactArgs(1, "an image REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			img, err := c.GetImage(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, img)
			}
			if err := kv(a.stdout, "name", img.Name, "digest", img.Digest, "size", formatSize(img.Size),
				"owner", orDash(img.Owner), "public", img.Public, "created", img.CreatedAt.Format(time.RFC3339)); err != nil {
				return err
			}
			for i, l := range img.Layers {
				fmt.Fprintf(a.stdout, "layer %d:  %s\n", i+1, l)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newImageRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"remove"},
		Short:   "Remove image versions (blobs are freed by gc)",
		Args:    minArgs(1, "at least one image REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, ref := range args {
				if err := c.RemoveImage(cmd.Context(), ref); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", ref, err))
					continue
				}
				fmt.Fprintln(a.stdout, ref)
			}
			for i := 0; i+1 < len(errs); i++ {
				fmt.Fprintf(a.stderr, "dsec: %s\n", oneLine(errs[i].Error()))
			}
			return lastErr(errs)
		},
	}
}

func newImageGCCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete blobs no image or sandbox uses",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.GCImages(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, res)
			}
			fmt.Fprintf(a.stdout, "removed %d blobs (%s), kept %d\n", res.RemovedBlobs, formatSize(res.FreedBytes), res.KeptBlobs)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newImageStatsCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats REF",
		Short: "Show lazy-loading figures of an image on the node",
		Args:  exactArgs(1, "an image REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			st, err := c.ImageStats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, st)
			}
			return kv(a.stdout, "image", st.Image, "image size", formatSize(st.ImageBytes),
				"fetched", formatSize(st.FetchedBytes)+" ("+formatSize(st.TransferredBytes)+" transferred)", "read", formatSize(st.ReadBytes),
				"metadata requests", st.MetadataRequests,
				"cache", fmt.Sprintf("%d hits, %d misses (%.1f%% hit ratio)", st.CacheHits, st.CacheMisses, 100*st.HitRatio),
				"fetch wait", fmt.Sprintf("%.3fs", st.FetchWaitSecs))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newImagePullCmd(a *app) *cobra.Command {
	var public, progress, asJSON bool
	cmd := &cobra.Command{
		Use:   "pull [REGISTRY/]NAME[:TAG|@DIGEST]",
		Short: "Have the server pull an image from a registry",
		Long: `Have the server pull an image for its platform from a registry (plain
HTTP for localhost, 127.0.0.0/8 and private addresses, HTTPS otherwise;
Docker Hub when REF names no registry) and store it under its name
without the registry host:
127.0.0.1:5000/team/img:1 becomes team/img:1, python:3.12 stays python:3.12.
Admin only.`,
		Example: `  dsec image pull 127.0.0.1:5000/team/img:1
  dsec image pull registry.example/base@sha256:<hex>   # stored as base:sha256-<12 hex>`,
		Args: exactArgs(1, "an image REF"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			p := newProgress(a, progress || a.tty)
			defer p.done()
			img, err := c.PullImage(cmd.Context(), args[0], public, p.server)
			if err != nil {
				// Pulling is an extension of the contract: say what to do
				// instead when the server lacks it (404 for the route, 405,
				// or 501).
				if client.IsNotFound(err) || errors.Is(err, errdefs.ErrNotImplemented) || client.StatusCode(err) == 405 {
					return fmt.Errorf("pull %s: %w (if this server cannot pull, use `dsec image import`)", args[0], err)
				}
				return err
			}
			p.done()
			if asJSON {
				return printJSON(a.stdout, img)
			}
			fmt.Fprintf(a.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&public, "public", false, "make the image usable by every tenant")
	cmd.Flags().BoolVar(&progress, "progress", false, "show progress even when stderr is not a terminal")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
