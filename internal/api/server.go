package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Server serves a handler on unix:// and tcp:// listeners. Requests on a
// unix socket without a token are the admin (the socket is created mode
// 0600); requests on TCP always need a bearer token.
type Server struct {
	handler         http.Handler
	log             *slog.Logger
	shutdownTimeout time.Duration
}

// ServerOption configures NewServer.
type ServerOption func(*Server)

// WithShutdownTimeout bounds the graceful shutdown (default 10s); streams
// still open then are cut.
func WithShutdownTimeout(d time.Duration) ServerOption {
	return func(s *Server) { s.shutdownTimeout = d }
}

// NewServer returns a Server for h.
func NewServer(h http.Handler, logger *slog.Logger, opts ...ServerOption) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{handler: h, log: logger, shutdownTimeout: 10 * time.Second}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Listen opens one listener for an address "unix:///path/to/sock" or
// "tcp://host:port". A unix socket is created mode 0600 under a temporary
// name and renamed into place, so it is never reachable with looser
// permissions; a stale socket (nobody answering) is replaced, a live one
// or a non-socket file is an error.
func Listen(addr string) (net.Listener, error) {
	switch {
	case strings.HasPrefix(addr, "unix://"):
		return listenUnix(strings.TrimPrefix(addr, "unix://"))
	case strings.HasPrefix(addr, "tcp://"):
		hostport := strings.TrimPrefix(addr, "tcp://")
		if _, _, err := net.SplitHostPort(hostport); err != nil {
			return nil, invalid("listen address %q: %v", addr, err)
		}
		return net.Listen("tcp", hostport)
	}
	return nil, invalid("listen address %q: want unix:///path or tcp://host:port", addr)
}

func listenUnix(path string) (net.Listener, error) {
	if path == "" || !filepath.IsAbs(path) {
		return nil, invalid("unix socket path %q must be absolute", path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket: %w", path, errdefs.ErrAlreadyExists)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another server is listening: %w", path, errdefs.ErrAlreadyExists)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	// The listener would unlink its temporary name on Close; the socket
	// lives at path after the rename, which unixListener removes.
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { _ = os.Remove(l.path) })
	return err
}

// Serve listens on every address and serves until ctx is done, then shuts
// down gracefully: no new connections, in-flight requests get the shutdown
// timeout to finish.
func (s *Server) Serve(ctx context.Context, addrs ...string) error {
	if len(addrs) == 0 {
		return invalid("no listen addresses")
	}
	var ls []net.Listener
	for _, a := range addrs {
		l, err := Listen(a)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return err
		}
		ls = append(ls, l)
	}
	return s.ServeListeners(ctx, ls...)
}

// ServeListeners is Serve on listeners the caller opened (with Listen).
func (s *Server) ServeListeners(ctx context.Context, ls ...net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ConnContext:       ConnContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	errc := make(chan error, len(ls))
	for _, l := range ls {
		s.log.Info("api listening", "addr", l.Addr().String(), "network", l.Addr().Network())
		go func() { errc <- srv.Serve(l) }()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.shutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		_ = srv.Close()
	}
	for _, l := range ls {
		_ = l.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
