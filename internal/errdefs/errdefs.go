// Package errdefs defines the small set of error classes agentenv uses and
// maps them to HTTP status codes at the API edge. Packages wrap these classes
// with %w and a message that says what was wrong and what to do; only the API
// layer turns them into transport codes.
package errdefs

import (
	"errors"
	"fmt"
	"net/http"
)

// The error classes. Wrap them: fmt.Errorf("template %q: %w", name, ErrNotFound).
var (
	ErrNotFound          = errors.New("not found")
	ErrInvalid           = errors.New("invalid argument")
	ErrConflict          = errors.New("conflict")
	ErrUnavailable       = errors.New("unavailable")
	ErrResourceExhausted = errors.New("resource exhausted")
	ErrUnauthenticated   = errors.New("unauthenticated")
	// ErrPermissionDenied: the caller is known but may not do this (an
	// API key asking for an operator's action).
	ErrPermissionDenied = errors.New("permission denied")
	ErrTooLarge         = errors.New("request too large")
	// ErrInsufficientStorage: the host's disk budget (or a storage quota
	// such as the templates') has no room for what was asked (HTTP 507).
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// Invalid returns an ErrInvalid error with a formatted message.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}

// NotFound returns an ErrNotFound error with a formatted message.
func NotFound(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrNotFound)
}

// Conflict returns an ErrConflict error with a formatted message.
func Conflict(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrConflict)
}

// Unavailable returns an ErrUnavailable error with a formatted message: a
// failure that says nothing about the request (the host is busy, a
// sandbox died while starting), so the same request may succeed when
// retried.
func Unavailable(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrUnavailable)
}

// InsufficientStorage returns an ErrInsufficientStorage error with a
// formatted message, which should say what is used, the limit, and what
// frees room.
func InsufficientStorage(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInsufficientStorage)
}

// Classified reports whether err wraps one of the classes (otherwise it is
// an internal error).
func Classified(err error) bool {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return true
		}
	}
	return false
}

// Retryable reports whether the same request may succeed later, or on
// another node (ErrUnavailable, ErrResourceExhausted, ErrInsufficientStorage):
// the API then tells clients when to retry, and a fleet tries the next node.
func Retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrResourceExhausted) || errors.Is(err, ErrInsufficientStorage)
}

// classes lists each class with its HTTP status and machine-readable code,
// most specific first.
var classes = []struct {
	err    error
	status int
	code   string
}{
	{ErrNotFound, http.StatusNotFound, "not_found"},
	{ErrInvalid, http.StatusBadRequest, "invalid_argument"},
	{ErrConflict, http.StatusConflict, "conflict"},
	{ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
	{ErrPermissionDenied, http.StatusForbidden, "permission_denied"},
	{ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{ErrInsufficientStorage, http.StatusInsufficientStorage, "insufficient_storage"},
	{ErrResourceExhausted, http.StatusTooManyRequests, "resource_exhausted"},
	{ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
}

// HTTPStatus maps an error to its HTTP status and machine-readable code.
// Errors of no known class are internal errors (500).
func HTTPStatus(err error) (int, string) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, "internal"
}

// FromCode rebuilds an error of the class with the machine-readable code
// (from HTTPStatus) around message: how an error crosses a process
// boundary (node → API server) and keeps its class.
func FromCode(code, message string) error {
	for _, c := range classes {
		if c.code == code {
			return Received(message, c.err)
		}
	}
	return errors.New(message)
}

// Received is an error another process sent: message as sent, wrapping
// class (nil for none) so errors.Is answers as on the sender's side. Every
// transport's codec decodes into it; none keeps a type of its own.
func Received(message string, class error) error {
	if class == nil {
		return errors.New(message)
	}
	return &coded{msg: message, class: class}
}

// coded is an error received from another process: its text as sent,
// its class for errors.Is.
type coded struct {
	msg   string
	class error
}

func (e *coded) Error() string { return e.msg }
func (e *coded) Unwrap() error { return e.class }
