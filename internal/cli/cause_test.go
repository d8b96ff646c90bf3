package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

// TestPrintErrorNamesCause: an error that says what ended the sandbox or
// the command is printed with a line naming the cause (as the Python
// SDK's exception.cause), others alone.
func TestPrintErrorNamesCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&client.Error{Status: 404, Message: "sandbox x was lost: it ran out of its memory limit", EndCause: "oom"}, "cause: oom (out of memory: "},
		{&client.Error{Status: 404, Message: "sandbox x was lost: it stopped unexpectedly", EndCause: "lost"}, "cause: lost (the sandbox died on its own"},
		{fmt.Errorf("%w (after 2s)", client.ErrProcessTimeout), "cause: command_timeout ("},
		{&client.Error{Status: 400, Message: "bad"}, ""},
	} {
		var b strings.Builder
		printError(&b, tc.err)
		lines := strings.Split(strings.TrimSpace(b.String()), "\n")
		if lines[0] != "error: "+tc.err.Error() {
			t.Errorf("%v: first line %q, want the error", tc.err, lines[0])
		}
		switch {
		case tc.want == "" && len(lines) != 1:
			t.Errorf("%v: got %q, want the error alone", tc.err, b.String())
		case tc.want != "" && (len(lines) != 2 || !strings.HasPrefix(lines[1], tc.want)):
			t.Errorf("%v: got %q, want a second line starting %q", tc.err, b.String(), tc.want)
		}
	}
}
