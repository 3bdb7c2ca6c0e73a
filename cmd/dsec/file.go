package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsec-dev/dsec/client"
)

func newFileCmd(a *app) *cobra.Command {
	cmd := group("file", "Read and write files inside a sandbox", "files", "fs")
	cmd.AddCommand(newFilePutCmd(a), newFileGetCmd(a), newFileLsCmd(a), newFileRmCmd(a),
		newFileMkdirCmd(a), newFileMvCmd(a), newFileStatCmd(a))
	return cmd
}

func newFilePutCmd(a *app) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "put ID LOCAL REMOTE",
		Short: `Upload a local file ("-" = stdin) to an absolute path in a sandbox`,
		Args:  exactArgs(3, "a sandbox ID, a local file and a remote path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := parseMode(mode)
			if err != nil {
				return usageError{err}
			}
			var r io.Reader = a.stdin
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				if st, err := f.Stat(); err == nil && st.IsDir() {
					return usagef("%s is a directory; put copies one file", args[1])
				}
				r = f
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			_, err = c.WriteFile(cmd.Context(), args[0], args[2], os.FileMode(m&0o777)|modeSpecial(m), r)
			return err
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "0644", "octal permissions of the file")
	return cmd
}

func modeSpecial(m uint32) os.FileMode {
	var fm os.FileMode
	if m&0o4000 != 0 {
		fm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		fm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

func newFileGetCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID REMOTE LOCAL",
		Short: `Download a file from a sandbox to LOCAL ("-" = stdout)`,
		Args:  exactArgs(3, "a sandbox ID, a remote path and a local file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			rc, info, err := c.ReadFile(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			defer rc.Close()
			if args[2] == "-" {
				_, err := io.Copy(a.stdout, rc)
				return err
			}
			// Write next to the target and rename, so a failed download
			// never leaves a truncated file under the wanted name.
			dst := args[2]
			if st, err := os.Stat(dst); err == nil && st.IsDir() {
				dst = filepath.Join(dst, filepath.Base(args[1]))
			}
			perm := info.Mode.Perm()
			if perm == 0 {
				perm = 0o644
			}
			tmp, err := os.CreateTemp(filepath.Dir(dst), ".dsec-get-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			n, err := io.Copy(tmp, rc)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("download %s: %w", args[1], err)
			}
			if info.Size >= 0 && n != info.Size {
				return fmt.Errorf("download %s: got %d of %d bytes", args[1], n, info.Size)
			}
			if err := os.Chmod(tmp.Name(), perm); err != nil {
				return err
			}
			return os.Rename(tmp.Name(), dst)
		},
	}
}

func newFileLsCmd(a *app) *cobra.Command {
	var depth int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls ID PATH",
		Short: "List a directory in a sandbox",
		Args:  exactArgs(2, "a sandbox ID and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if depth < 1 {
				return usagef("--depth must be at least 1")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListDir(cmd.Context(), args[0], args[1], depth)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []client.FileInfo{}
				}
				return printJSON(a.stdout, list)
			}
			t := newTable(a.stdout, "MODE", "UID", "GID", "SIZE", "MODIFIED", "PATH")
			for _, fi := range list {
				name := fi.Path
				if fi.Symlink != "" {
					name += " -> " + fi.Symlink
				}
				t.row(fi.Mode.String(), fi.UID, fi.GID, fi.Size, fi.ModTime.Format(time.DateTime), name)
			}
			return t.flush()
		},
	}
	cmd.Flags().IntVar(&depth, "depth", 1, "levels to descend (1 = the directory's entries)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newFileRmCmd(a *app) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm ID PATH",
		Short: "Remove a file (or, with -r, a directory tree) in a sandbox",
		Args:  exactArgs(2, "a sandbox ID and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Remove(cmd.Context(), args[0], args[1], recursive)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return cmd
}

func newFileMkdirCmd(a *app) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "mkdir ID PATH",
		Short: "Create a directory (and missing parents) in a sandbox",
		Args:  exactArgs(2, "a sandbox ID and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := parseMode(mode)
			if err != nil {
				return usageError{err}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.MakeDir(cmd.Context(), args[0], args[1], os.FileMode(m&0o777))
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "0755", "octal permissions")
	return cmd
}

func newFileMvCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "mv ID FROM TO",
		Aliases: []string{"rename"},
		Short:   "Rename a path in a sandbox",
		Args:    exactArgs(3, "a sandbox ID, a source and a destination path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.Rename(cmd.Context(), args[0], args[1], args[2])
		},
	}
}

func newFileStatCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat ID PATH",
		Short: "Describe a path in a sandbox",
		Args:  exactArgs(2, "a sandbox ID and a path"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			fi, err := c.Stat(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(a.stdout, fi)
			}
			return kv(a.stdout, "path", fi.Path, "size", fi.Size, "mode", fmt.Sprintf("%s (%04o)", fi.Mode, fi.Mode.Perm()),
				"dir", fi.IsDir, "symlink", orDash(fi.Symlink), "owner", fmt.Sprintf("%d:%d", fi.UID, fi.GID),
				"modified", fi.ModTime.Format(time.RFC3339))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
