package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/dsec-dev/dsec/internal/errdefs"
)

// Error codes on the wire, one per errdefs class.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeUnauthenticated    = "unauthenticated"
	CodePermissionDenied   = "permission_denied"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeFailedPrecondition = "failed_precondition"
	CodeResourceExhausted  = "resource_exhausted"
	CodeNotImplemented     = "not_implemented"
	CodeUnavailable        = "unavailable"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeCanceled           = "canceled"
	CodeInternal           = "internal"
)

var classes = []struct {
	class  error
	code   string
	status int
}{
	{errdefs.ErrInvalidArgument, CodeInvalidArgument, http.StatusBadRequest},
	{errdefs.ErrUnauthenticated, CodeUnauthenticated, http.StatusUnauthorized},
	{errdefs.ErrPermissionDenied, CodePermissionDenied, http.StatusForbidden},
	{errdefs.ErrNotFound, CodeNotFound, http.StatusNotFound},
	{errdefs.ErrAlreadyExists, CodeAlreadyExists, http.StatusConflict},
	{errdefs.ErrFailedPrecondition, CodeFailedPrecondition, http.StatusConflict},
	{errdefs.ErrResourceExhausted, CodeResourceExhausted, http.StatusTooManyRequests},
	{errdefs.ErrNotImplemented, CodeNotImplemented, http.StatusNotImplemented},
	{errdefs.ErrUnavailable, CodeUnavailable, http.StatusServiceUnavailable},
	{errdefs.ErrDeadlineExceeded, CodeDeadlineExceeded, http.StatusGatewayTimeout},
	{context.DeadlineExceeded, CodeDeadlineExceeded, http.StatusGatewayTimeout},
	{context.Canceled, CodeCanceled, 499}, // the client went away
}

// ErrorCode is the wire code of err's class ("internal" if it has none).
func ErrorCode(err error) string {
	_, code := HTTPStatus(err)
	return code
}

// HTTPStatus maps an error to its HTTP status and wire code.
func HTTPStatus(err error) (int, string) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, CodeInvalidArgument
	}
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, CodeInternal
}

// ErrorFromCode turns a wire error back into an errdefs-classed error, for
// clients (the Go SDK) so that callers can use errdefs.IsNotFound & co.
func ErrorFromCode(code, msg string) error {
	for _, c := range classes {
		if c.code == code {
			return &wireError{msg: msg, class: c.class}
		}
	}
	return errors.New(msg)
}

// wireError keeps the server's message as is (it already names its class)
// while unwrapping to the class.
type wireError struct {
	msg   string
	class error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.class }
