package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
)

func TestWriteErrorRetryAfter(t *testing.T) {
	tests := []struct {
		err        error
		status     int
		retryAfter string
	}{
		{errdefs.Unavailable("start sandbox: the sandbox process exited before it booted"), http.StatusServiceUnavailable, "1"},
		{fmt.Errorf("limit of 2 sandboxes reached: %w", errdefs.ErrResourceExhausted), http.StatusTooManyRequests, "1"},
		{errdefs.InsufficientStorage("no room on the host disk for a sandbox"), http.StatusInsufficientStorage, "1"},
		{errdefs.Invalid("memoryMB 1 out of range"), http.StatusBadRequest, ""},
		{errdefs.NotFound("sandbox x"), http.StatusNotFound, ""},
		{errors.New("bug"), http.StatusInternalServerError, ""},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		writeError(rec, tt.err)
		if rec.Code != tt.status {
			t.Errorf("%v: got status %d, want %d", tt.err, rec.Code, tt.status)
		}
		if got := rec.Header().Get("Retry-After"); got != tt.retryAfter {
			t.Errorf("%v: got Retry-After %q, want %q", tt.err, got, tt.retryAfter)
		}
		var body wire.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Status != tt.status || body.Message != tt.err.Error() {
			t.Errorf("%v: got body %s (%v), want code %d and the message", tt.err, rec.Body, err, tt.status)
		}
	}
}
