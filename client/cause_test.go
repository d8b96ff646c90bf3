package client

import (
	"errors"
	"fmt"
	"testing"
)

// TestCause: what ended a command or a sandbox is read from the error:
// a command past its timeout or killed out of memory, or the end_cause of
// the API's 404 (also behind a NotRunningError); other errors say none.
func TestCause(t *testing.T) {
	gone := func(cause string) error {
		ae := &Error{Status: 404, ErrorCode: "not_found", Message: "sandbox x does not exist", EndCause: cause}
		return &NotRunningError{SandboxID: "x", msg: ae.Message, errs: []error{ae, errors.New("stream broken")}}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w (after 1s)", ErrProcessTimeout), CauseCommandTimeout},
		{endError("out of memory: the sandbox used 510 MiB of its 512 MiB limit"), CauseOOM},
		{endError("signal: killed"), ""},
		{gone("killed"), CauseKilled},
		{gone("timeout"), CauseSandboxTimeout},
		{gone("oom"), CauseOOM},
		{gone("lost"), CauseLost},
		{gone(""), ""},
		{&Error{Status: 400, ErrorCode: "invalid_argument"}, ""},
		{nil, ""},
	} {
		if got := Cause(tc.err); got != tc.want {
			t.Errorf("Cause(%v): got %q, want %q", tc.err, got, tc.want)
		}
	}
	if err := endError("out of memory: x"); err.Error() != "process error: out of memory: x" {
		t.Errorf("message: got %q, want it unchanged", err)
	}
}
