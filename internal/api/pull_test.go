package api

import (
	"testing"

	"github.com/dsec-dev/dsec/internal/errdefs"
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
