package seccomp

import (
	"runtime"
	"testing"
)

func TestSharedDefaultFilter(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("no default profile for " + runtime.GOARCH)
	}
	for _, opts := range []Options{{}, {AllowUserNS: true}} {
		a, err := SharedDefaultFilter(opts)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := SharedDefaultFilter(opts)
		if len(a) == 0 || &a[0] != &b[0] {
			t.Errorf("%+v: not shared", opts)
		}
		want, _ := DefaultFilter(opts)
		if len(want) != len(a) {
			t.Fatalf("%+v: %d instructions, want %d", opts, len(a), len(want))
		}
		for i := range want {
			if want[i] != a[i] {
				t.Fatalf("%+v: instruction %d differs", opts, i)
			}
		}
	}
	x, _ := SharedDefaultFilter(Options{})
	y, _ := SharedDefaultFilter(Options{AllowUserNS: true})
	if &x[0] == &y[0] {
		t.Error("different options share one filter")
	}
}
