package errdefs_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

func TestHTTPStatus(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"not found", errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
		{"invalid", errdefs.ErrInvalid, http.StatusBadRequest, "invalid_argument"},
		{"conflict", errdefs.ErrConflict, http.StatusConflict, "conflict"},
		{"unauthenticated", errdefs.ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
		{"too large", errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
		{"resource exhausted", errdefs.ErrResourceExhausted, http.StatusTooManyRequests, "resource_exhausted"},
		{"unavailable", errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
		{"insufficient storage", errdefs.ErrInsufficientStorage, http.StatusInsufficientStorage, "insufficient_storage"},
		{"InsufficientStorage helper", errdefs.InsufficientStorage("full %s", "x"), http.StatusInsufficientStorage, "insufficient_storage"},
		{"unknown", errors.New("disk on fire"), http.StatusInternalServerError, "internal"},
		{"Invalid helper", errdefs.Invalid("bad %s", "x"), http.StatusBadRequest, "invalid_argument"},
		{"NotFound helper", errdefs.NotFound("no %s", "x"), http.StatusNotFound, "not_found"},
		{"Conflict helper", errdefs.Conflict("busy %s", "x"), http.StatusConflict, "conflict"},
		{"Unavailable helper", errdefs.Unavailable("busy %s", "x"), http.StatusServiceUnavailable, "unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for depth, err := range []error{
				tt.err,
				fmt.Errorf("inner: %w", tt.err),
				fmt.Errorf("outer: %w", fmt.Errorf("inner: %w", tt.err)),
			} {
				status, code := errdefs.HTTPStatus(err)
				if status != tt.status || code != tt.code {
					t.Errorf("wrapped %d times: got %d %q, want %d %q", depth, status, code, tt.status, tt.code)
				}
				if got, want := errdefs.Classified(err), tt.status != http.StatusInternalServerError; got != want {
					t.Errorf("wrapped %d times: Classified = %v, want %v", depth, got, want)
				}
				retry := tt.status == http.StatusServiceUnavailable || tt.status == http.StatusTooManyRequests || tt.status == http.StatusInsufficientStorage
				if got := errdefs.Retryable(err); got != retry {
					t.Errorf("wrapped %d times: Retryable = %v, want %v", depth, got, retry)
				}
			}
			// %v loses the class: such an error is internal.
			if tt.status != http.StatusInternalServerError {
				if status, _ := errdefs.HTTPStatus(fmt.Errorf("lost: %v", tt.err)); status != http.StatusInternalServerError {
					t.Errorf("wrapped with %%v: got %d, want 500", status)
				}
			}
		})
	}
}

func TestHelpersKeepMessage(t *testing.T) {
	tests := []struct {
		err   error
		class error
		want  string
	}{
		{errdefs.Invalid("template name %q", "X"), errdefs.ErrInvalid, `template name "X": invalid argument`},
		{errdefs.NotFound("sandbox %s", "i1"), errdefs.ErrNotFound, "sandbox i1: not found"},
		{errdefs.Conflict("template %s in use", "t"), errdefs.ErrConflict, "template t in use: conflict"},
		{errdefs.InsufficientStorage("disk budget %s", "full"), errdefs.ErrInsufficientStorage, "disk budget full: insufficient storage"},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.class) {
			t.Errorf("%v: not of class %v", tt.err, tt.class)
		}
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("got message %q, want %q", got, tt.want)
		}
	}
}
