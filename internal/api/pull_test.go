package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
	"github.com/dsec-dev/dsec/internal/store"
)

func TestPullName(t *testing.T) {
	for _, tc := range []struct {
		ref, want string
		bad       bool
	}{
		{ref: "127.0.0.1:5000/team/img:1", want: "team/img:1"},
		{ref: "localhost:5000/img", want: "img:latest"},
		{ref: "registry.example/a/b/c:v1.2", want: "a/b/c:v1.2"},
		{ref: "python:3.12", want: "python:3.12"},
		{ref: "docker.io/library/busybox:1.36", want: "busybox:1.36"},
		{ref: "ghcr.io/library/x:1", want: "library/x:1"},
		{ref: "reg.example:443/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", want: "img:sha256-0123456789ab"},
		{ref: "", bad: true},
		{ref: "reg.example/Img:1", bad: true},
		{ref: "img@md5:abc", bad: true},
		{ref: "reg.example/../x:1", bad: true},
	} {
		got, err := pullName(tc.ref)
		if tc.bad {
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("pullName(%q) = %q, %v; want an invalid-argument error", tc.ref, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("pullName(%q) = %q, %v; want %q", tc.ref, got, err, tc.want)
		}
	}
}

// pullingImages is a fakeImages that can pull: src refs containing
// "missing" are not in the registry.
type pullingImages struct {
	*fakeImages
	pulled []string
}

func (p *pullingImages) Pull(ctx context.Context, src, ref string, progress func(ImportProgress)) (*ImageInfo, error) {
	if strings.Contains(src, "missing") {
		return nil, fmt.Errorf("pull %s: %w", src, errdefs.ErrNotFound)
	}
	p.pulled = append(p.pulled, src)
	return p.add(ref, 42, progress)
}

func TestPullImageRoute(t *testing.T) {
	e := newEnv(t)
	// The fake image store of newEnv cannot pull: 501, a clear error.
	r := e.do("POST", "/v1/images/pull?ref=127.0.0.1:5000/team/img:1", e.admin, nil)
	if r.status != http.StatusNotImplemented || r.errBody(t).Code != "not_implemented" {
		t.Fatalf("pull without a puller: %d %s", r.status, r.body)
	}

	imgs := &pullingImages{fakeImages: newFakeImages()}
	svc, err := NewService(e.cfg, e.st, StaticNodes{"node1": e.node}, imgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The env's cleanup closes e.srv and e.svc: swap in the pulling ones
	// and close the first ones here.
	first, firstSvc := e.srv, e.svc
	t.Cleanup(func() { first.Close(); firstSvc.Close() })
	e.srv, e.svc = httptest.NewServer(NewHandler(svc)), svc

	r = e.do("POST", "/v1/images/pull?ref=127.0.0.1:5000/team/img:1", e.admin, nil)
	if r.status != http.StatusOK {
		t.Fatalf("pull: %d %s", r.status, r.body)
	}
	var last ImportFrame
	for _, line := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
		last = ImportFrame{}
		if err := json.Unmarshal([]byte(line), &last); err != nil {
			t.Fatalf("frame %q: %v", line, err)
		}
	}
	if last.Image == nil || last.Image.Name != "team/img:1" || last.Image.Owner != AdminTenant {
		t.Fatalf("last frame: %+v", last)
	}
	if len(imgs.pulled) != 1 || imgs.pulled[0] != "127.0.0.1:5000/team/img:1" {
		t.Fatalf("pulled %v", imgs.pulled)
	}

	for _, tc := range []struct {
		name, query string
		token       func() string
		status      int
	}{
		{"tenant", "ref=reg.example/x:1", func() string { return e.tenant("t1", Quota{}) }, http.StatusForbidden},
		{"no ref", "", func() string { return e.admin }, http.StatusBadRequest},
		{"bad name", "ref=reg.example/Bad:1", func() string { return e.admin }, http.StatusBadRequest},
		{"missing", "ref=reg.example/missing:1", func() string { return e.admin }, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/images/pull?"+tc.query, tc.token(), nil)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			}
			r.errBody(t)
		})
	}
	// A failed pull leaves no image and no claimed name behind.
	var list []ImageInfo
	e.doJSON("GET", "/v1/images", e.admin, nil, http.StatusOK, &list)
	if len(list) != 1 || list[0].Name != "team/img:1" {
		t.Fatalf("images after pulls: %+v", list)
	}
	if err := e.st.Get(context.Background(), store.BucketImageACL, "missing", &imageACL{}); !errdefs.IsNotFound(err) {
		t.Fatalf("acl of the failed pull: %v", err)
	}
}
