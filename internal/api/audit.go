package api

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// AuditFile is the audit log's name in the data dir.
const AuditFile = "audit.log"

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	Time      time.Time `json:"time"`
	Tenant    string    `json:"tenant"`
	TokenID   string    `json:"token_id,omitempty"`
	Method    string    `json:"method"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	Code      string    `json:"code"` // "ok" or the error code
	Error     string    `json:"error,omitempty"`
}

// auditLog appends JSON lines to a file in the server's data dir (never in
// a sandbox) and rotates it at a size: audit.log -> audit.log.1 -> ... .
type auditLog struct {
	mu   sync.Mutex
	path string
	max  int64
	keep int
	f    *os.File
	size int64
	bad  bool // a write failed; reported once
}

func openAuditLog(dir string, max int64, keep int) (*auditLog, error) {
	a := &auditLog{path: filepath.Join(dir, AuditFile), max: max, keep: keep}
	if err := a.open(); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *auditLog) open() error {
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("api: audit log: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("api: audit log: %w", err)
	}
	a.f, a.size = f, fi.Size()
	return nil
}

func (a *auditLog) rotate() error {
	if err := a.f.Close(); err != nil {
		return err
	}
	for i := a.keep - 1; i >= 1; i-- {
		_ = os.Rename(fmt.Sprintf("%s.%d", a.path, i), fmt.Sprintf("%s.%d", a.path, i+1))
	}
	if a.keep > 0 {
		if err := os.Rename(a.path, a.path+".1"); err != nil {
			return err
		}
	} else if err := os.Remove(a.path); err != nil {
		return err
	}
	return a.open()
}

// Record appends one entry. Audit failures are logged once but do not fail
// the call: an unwritable disk should not take the API down.
func (a *auditLog) Record(now time.Time, c Caller, method, sandboxID string, err error) {
	e := AuditEntry{Time: now.UTC(), Tenant: c.Tenant, TokenID: c.TokenID, Method: method, SandboxID: sandboxID, Code: "ok"}
	if err != nil {
		e.Code, e.Error = ErrorCode(err), err.Error()
	}
	line, _ := json.Marshal(e)
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return
	}
	if a.size > 0 && a.size+int64(len(line)) > a.max {
		if rerr := a.rotate(); rerr != nil {
			a.bad = true
			return
		}
	}
	n, werr := a.f.Write(line)
	a.size += int64(n)
	if werr != nil {
		a.bad = true
	}
}

func (a *auditLog) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f == nil {
		return nil
	}
	err := a.f.Close()
	a.f = nil
	return err
}
