package api

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"testing"

	"github.com/dsec-dev/dsec/internal/runtime"
)

func noIO() runtime.IO { return runtime.IO{Stdout: io.Discard, Stderr: io.Discard} }

func osStat(p string) (int64, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func readAudit(t *testing.T, path string) []AuditEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []AuditEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var a AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, a)
	}
	return out
}
