package clienttest

import (
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/dsec-dev/dsec/internal/api"
)

// Server is a running test server.
type Server struct {
	HTTP    *httptest.Server
	Service *Service
	// Addr is the address to hand to client.New / DSEC_ADDR.
	Addr string
}

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Unix listens on a unix socket (admin caller, no token); otherwise
	// TCP on loopback with RequireAuth.
	Unix bool
	// Images are registered up front.
	Images []string
}

// NewServer starts a Service behind the real API handler (api.NewHandler)
// and stops it (and kills its
// execs and removes its sandbox roots) when the test ends.
func NewServer(t testing.TB, opts ServerOptions) *Server {
	t.Helper()
	dir := t.TempDir()
	svc := NewService(filepath.Join(dir, "sandboxes"))
	for _, img := range opts.Images {
		svc.AddImage(img)
	}
	hs := httptest.NewUnstartedServer(api.NewHandler(svc))
	// As in `dsec serve`: callers on the unix socket are the admin, TCP
	// callers need a bearer token.
	hs.Config.ConnContext = api.ConnContext
	s := &Server{HTTP: hs, Service: svc}
	if opts.Unix {
		sock := filepath.Join(dir, "dsec.sock")
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatalf("listen on %s: %v", sock, err)
		}
		hs.Listener.Close()
		hs.Listener = l
		s.Addr = "unix://" + sock
	}
	hs.Start()
	if !opts.Unix {
		s.Addr = hs.URL
	}
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		svc.mu.Lock()
		ids := make([]string, 0, len(svc.sandboxes))
		for id := range svc.sandboxes {
			ids = append(ids, id)
		}
		svc.mu.Unlock()
		for _, id := range ids {
			_ = svc.DeleteSandbox(t.Context(), rootCaller, id)
		}
		_ = os.RemoveAll(dir)
	})
	return s
}
