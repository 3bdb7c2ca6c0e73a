package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/dsec-dev/dsec/internal/api"
	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Error is a failure reported by the server (a non-2xx reply or an error
// frame in a stream). It unwraps to the errdefs class named by Code, or
// derived from the HTTP status when the code is unknown, so
// errors.Is(err, errdefs.ErrNotFound) works.
type Error struct {
	// StatusCode is the HTTP status (for a stream's error frame, the status
	// that the code maps to).
	StatusCode int
	// Code is the machine-readable class, e.g. "not_found".
	Code string
	// Message is the server's one-line explanation.
	Message string
}

func (e *Error) Error() string {
	if e.Message != "" {
		return e.Message
	}
	if e.Code != "" {
		return strings.ReplaceAll(e.Code, "_", " ")
	}
	return fmt.Sprintf("HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// Unwrap returns the errdefs class, or nil when the status says nothing
// more specific than "request failed".
func (e *Error) Unwrap() error {
	if c, ok := codeClass[e.Code]; ok {
		return c
	}
	return statusClass(e.StatusCode)
}

// codeClass maps the contract's error codes to errdefs classes. (The
// server's api.HTTPStatus is the other direction.)
var codeClass = map[string]error{
	api.CodeNotFound:           errdefs.ErrNotFound,
	api.CodeAlreadyExists:      errdefs.ErrAlreadyExists,
	api.CodeInvalidArgument:    errdefs.ErrInvalidArgument,
	api.CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
	api.CodeUnauthenticated:    errdefs.ErrUnauthenticated,
	api.CodePermissionDenied:   errdefs.ErrPermissionDenied,
	api.CodeResourceExhausted:  errdefs.ErrResourceExhausted,
	api.CodeUnavailable:        errdefs.ErrUnavailable,
	api.CodeNotImplemented:     errdefs.ErrNotImplemented,
	api.CodeDeadlineExceeded:   errdefs.ErrDeadlineExceeded,
}

// codeStatus is the status each code travels with (for stream frames,
// where the HTTP status was already 200).
var codeStatus = map[string]int{
	api.CodeNotFound:           http.StatusNotFound,
	api.CodeAlreadyExists:      http.StatusConflict,
	api.CodeInvalidArgument:    http.StatusBadRequest,
	api.CodeFailedPrecondition: http.StatusConflict,
	api.CodeUnauthenticated:    http.StatusUnauthorized,
	api.CodePermissionDenied:   http.StatusForbidden,
	api.CodeResourceExhausted:  http.StatusTooManyRequests,
	api.CodeUnavailable:        http.StatusServiceUnavailable,
	api.CodeNotImplemented:     http.StatusNotImplemented,
	api.CodeDeadlineExceeded:   http.StatusGatewayTimeout,
}

func statusClass(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		// 409 carries both "already exists" and "failed precondition";
		// without a code, the latter is the safer reading.
		return errdefs.ErrFailedPrecondition
	case http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case http.StatusNotImplemented:
		return errdefs.ErrNotImplemented
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return errdefs.ErrUnavailable
	case http.StatusGatewayTimeout:
		return errdefs.ErrDeadlineExceeded
	}
	return nil
}

// errorBody is the contract's error reply and error frame.
type errorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// frameError turns an error frame of a stream into an *Error.
func frameError(msg, code string) *Error {
	st, ok := codeStatus[code]
	if !ok {
		st = http.StatusInternalServerError
	}
	return &Error{StatusCode: st, Code: code, Message: msg}
}

// responseError reads a failed reply. A body that is not the contract's JSON
// (a proxy's HTML page, a plain-text 404 from a mux) still yields a useful
// one-line message.
func responseError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{StatusCode: resp.StatusCode}
	var eb errorBody
	if json.Unmarshal(body, &eb) == nil && (eb.Error != "" || eb.Code != "") {
		e.Code, e.Message = eb.Code, eb.Error
		return e
	}
	msg := strings.TrimSpace(string(body))
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 200 {
		msg = msg[:200]
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	e.Message = fmt.Sprintf("%s (HTTP %d %s %s)", msg, resp.StatusCode, resp.Request.Method, resp.Request.URL.Path)
	return e
}

// StatusCode returns the HTTP status of a server error, or 0.
func StatusCode(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

// Convenience predicates over the errdefs classes.
func IsNotFound(err error) bool          { return errors.Is(err, errdefs.ErrNotFound) }
func IsAlreadyExists(err error) bool     { return errors.Is(err, errdefs.ErrAlreadyExists) }
func IsInvalidArgument(err error) bool   { return errors.Is(err, errdefs.ErrInvalidArgument) }
func IsUnauthenticated(err error) bool   { return errors.Is(err, errdefs.ErrUnauthenticated) }
func IsPermissionDenied(err error) bool  { return errors.Is(err, errdefs.ErrPermissionDenied) }
func IsResourceExhausted(err error) bool { return errors.Is(err, errdefs.ErrResourceExhausted) }
