package nodepb_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// TestErrorsCrossAsCodes: every error class survives the wire (as a code,
// and a detail where codes are shared), with its message; a lost
// sandbox stays lost and not found.
func TestErrorsCrossAsCodes(t *testing.T) {
	classes := []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrConflict, errdefs.ErrUnauthenticated,
		errdefs.ErrPermissionDenied, errdefs.ErrTooLarge, errdefs.ErrInsufficientStorage, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable}
	for _, class := range classes {
		t.Run(class.Error(), func(t *testing.T) {
			err := fmt.Errorf("sandbox x: %w", class)
			for name, got := range map[string]error{
				"rpc":   nodepb.Unwire(nodepb.Wire(err)),
				"child": nodepb.FromChildErr(nodepb.ChildErr(err)),
				"http":  nodepb.DecodeError(nodepb.EncodeError(err)),
			} {
				wantStatus, wantCode := errdefs.HTTPStatus(err)
				if status, code := errdefs.HTTPStatus(got); status != wantStatus || code != wantCode {
					t.Errorf("%s: got class %s, want %s", name, code, wantCode)
				}
				if got.Error() != err.Error() {
					t.Errorf("%s: got message %q, want %q", name, got, err)
				}
			}
		})
	}
	lost := fmt.Errorf("sandbox %q was lost: its node restarted: %w", "x", sandbox.ErrLost)
	got := nodepb.Unwire(nodepb.Wire(lost))
	if !errors.Is(got, sandbox.ErrLost) || !errors.Is(got, errdefs.ErrNotFound) || got.Error() != lost.Error() {
		t.Errorf("lost: got %v (lost %v, not found %v), want both", got, errors.Is(got, sandbox.ErrLost), errors.Is(got, errdefs.ErrNotFound))
	}
	// How a sandbox ended crosses too, for the API's 404.
	for _, cause := range []string{sandbox.EndKilled, sandbox.EndTimeout, sandbox.EndOOM} {
		ended := sandbox.WithEndCause(errdefs.NotFound("sandbox %q does not exist: it ended", "x"), cause)
		got := nodepb.Unwire(nodepb.Wire(ended))
		if sandbox.EndCause(got) != cause || !errors.Is(got, errdefs.ErrNotFound) || got.Error() != ended.Error() {
			t.Errorf("ended (%s): got %v with end cause %q, want not found with end cause %q", cause, got, sandbox.EndCause(got), cause)
		}
	}
	if got := nodepb.Unwire(nodepb.Wire(errors.New("disk on fire"))); errdefs.Classified(got) || got.Error() != "disk on fire" {
		t.Errorf("unclassified: got %v (classified %v)", got, errdefs.Classified(got))
	}
}
