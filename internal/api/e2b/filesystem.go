package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/dsec-dev/dsec/internal/api/e2b/proto/filesystem"
	"github.com/dsec-dev/dsec/internal/api/e2b/proto/filesystem/filesystemconnect"
	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/node"
)

// filesystemService is envd's filesystem.Filesystem over api.Service files.
type filesystemService struct{ h *Handler }

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// homeOf is the directory relative paths resolve against, as in envd: the
// user's home. dsec runs as root unless the SDK names a user.
func homeOf(user string) string {
	if user == "" || user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// resolvePath makes an envd path absolute.
func resolvePath(user, p string) (string, error) {
	if p == "" {
		return "", invalid("path is required")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", invalid("path contains a NUL byte")
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		p = strings.TrimPrefix(strings.TrimPrefix(p, "~"), "/")
	}
	if !strings.HasPrefix(p, "/") {
		p = path.Join(homeOf(user), p)
	}
	return path.Clean(p), nil
}

func entryInfo(fi *node.FileInfo) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:         fi.Name,
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         uint32(fi.Mode.Perm()),
		Permissions:  fi.Mode.String(),
		Owner:        idName(fi.UID),
		Group:        idName(fi.GID),
		ModifiedTime: timestamppb.New(fi.ModTime),
		Type:         pb.FileType_FILE_TYPE_FILE,
	}
	switch {
	case fi.Symlink != "":
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		t := fi.Symlink
		e.SymlinkTarget = &t
	case fi.IsDir:
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
	}
	return e
}

// idName names a uid or gid; dsec does not read the image's passwd file,
// so only root has a name.
func idName(id int) string {
	if id == 0 {
		return "root"
	}
	return strconv.Itoa(id)
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	id := envdFrom(ctx)
	p, err := resolvePath(id.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	fi, err := s.h.svc.StatFile(ctx, id.caller, id.sandboxID, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: entryInfo(fi)}), nil
}

// MakeDir creates a directory and its parents; an existing path is
// AlreadyExists (the SDK's makeDir then returns false).
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	id := envdFrom(ctx)
	p, err := resolvePath(id.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	if fi, err := s.h.svc.StatFile(ctx, id.caller, id.sandboxID, p); err == nil {
		what := "a directory"
		if !fi.IsDir {
			what = "a file"
		}
		return nil, connectError(fmt.Errorf("%s exists and is %s: %w", p, what, errdefs.ErrAlreadyExists))
	} else if !errdefs.IsNotFound(err) {
		return nil, connectError(err)
	}
	if err := s.h.svc.MakeDir(ctx, id.caller, id.sandboxID, p, 0o755); err != nil {
		return nil, connectError(err)
	}
	fi, err := s.h.svc.StatFile(ctx, id.caller, id.sandboxID, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	id := envdFrom(ctx)
	from, err := resolvePath(id.user, req.Msg.GetSource())
	if err != nil {
		return nil, connectError(err)
	}
	to, err := resolvePath(id.user, req.Msg.GetDestination())
	if err != nil {
		return nil, connectError(err)
	}
	if err := s.h.svc.Rename(ctx, id.caller, id.sandboxID, from, to); err != nil {
		return nil, connectError(err)
	}
	fi, err := s.h.svc.StatFile(ctx, id.caller, id.sandboxID, to)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: entryInfo(fi)}), nil
}

func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	id := envdFrom(ctx)
	p, err := resolvePath(id.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	fis, err := s.h.svc.ListDir(ctx, id.caller, id.sandboxID, p, depth)
	if err != nil {
		return nil, connectError(err)
	}
	out := &pb.ListDirResponse{Entries: make([]*pb.EntryInfo, 0, len(fis))}
	for i := range fis {
		out.Entries = append(out.Entries, entryInfo(&fis[i]))
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a directory tree (envd's RemoveAll, except
// that a missing path is NotFound).
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	id := envdFrom(ctx)
	p, err := resolvePath(id.user, req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	if p == "/" {
		return nil, connectError(invalid("refusing to remove the sandbox's root directory"))
	}
	if err := s.h.svc.Remove(ctx, id.caller, id.sandboxID, p, true); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

func (s *filesystemService) WatchDir(context.Context, *connect.Request[pb.WatchDirRequest], *connect.ServerStream[pb.WatchDirResponse]) error {
	return notImplemented("watching directories")
}

func (s *filesystemService) CreateWatcher(context.Context, *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	return nil, notImplemented("watching directories")
}

func (s *filesystemService) GetWatcherEvents(context.Context, *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	return nil, notImplemented("watching directories")
}

func (s *filesystemService) RemoveWatcher(context.Context, *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	return nil, notImplemented("watching directories")
}

// downloadFile is envd's GET /files: the file's bytes.
func (h *Handler) downloadFile(w http.ResponseWriter, r *http.Request, id envdIdentity) {
	user := r.URL.Query().Get("username")
	if user == "" {
		user = id.user
	}
	p, err := resolvePath(user, r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	rc, fi, err := h.svc.ReadFile(r.Context(), id.caller, id.sandboxID, p)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		h.log.Debug("e2b: download cut short", "sandbox", id.sandboxID, "path", p, "err", err)
	}
}

// writeInfo is envd's EntryInfo of an upload.
type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// uploadFile is envd's POST /files: a multipart form of "file" parts (the
// part's file name is the path when the query has none) or, for newer
// envd versions, the raw bytes of one file (optionally gzip-encoded).
// Parent directories are created; existing files are replaced.
func (h *Handler) uploadFile(w http.ResponseWriter, r *http.Request, id envdIdentity) {
	user := r.URL.Query().Get("username")
	if user == "" {
		user = id.user
	}
	qpath := r.URL.Query().Get("path")
	r.Body = http.MaxBytesReader(w, r.Body, h.maxUpload)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	write := func(target string, body io.Reader) error {
		p, err := resolvePath(user, target)
		if err != nil {
			return err
		}
		fi, err := h.svc.WriteFile(r.Context(), id.caller, id.sandboxID, p, 0o644, body)
		if err != nil {
			return err
		}
		out = append(out, writeInfo{Name: fi.Name, Type: "file", Path: fi.Path})
		return nil
	}
	var err error
	switch ct {
	case "multipart/form-data":
		err = h.uploadMultipart(r, qpath, write)
	case "application/octet-stream", "":
		body := io.Reader(r.Body)
		if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
			var zr *gzip.Reader
			if zr, err = gzip.NewReader(r.Body); err != nil {
				err = invalid("the body is not gzip: %v", err)
				break
			}
			defer zr.Close()
			body = zr
		}
		err = write(qpath, body)
	default:
		err = invalid("Content-Type %q: want multipart/form-data or application/octet-stream", ct)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = invalid("the upload is larger than %d bytes", h.maxUpload)
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) uploadMultipart(r *http.Request, qpath string, write func(string, io.Reader) error) error {
	mr, err := r.MultipartReader()
	if err != nil {
		return invalid("reading the multipart form: %v", err)
	}
	n := 0
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return invalid("reading the multipart form: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		target := qpath
		if target == "" {
			// The SDK puts the path in the file name; Go's FileName()
			// would strip it to its base, so read the raw parameter.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			target = params["filename"]
		}
		if target == "" {
			part.Close()
			return invalid("a file part has no path: give ?path= or a file name")
		}
		err = write(target, part)
		part.Close()
		if err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return invalid("the multipart form has no \"file\" part")
	}
	return nil
}
