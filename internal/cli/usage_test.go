package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// run executes the command tree on args and returns its error and output.
func run(args ...string) (string, error) {
	root := Root()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// TestUnknownCommands: a typo fails at every level with a usage error
// that names the nearest command, and prints no help that `ID=$(...)`
// would capture.
func TestUnknownCommands(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbx", "list"}, `unknown command "sandbx" for "agentenv"` + "\ndid you mean sandbox?"},
		{[]string{"sandbox", "crate", "base"}, `unknown command "crate" for "agentenv sandbox"` + "\ndid you mean create?"},
		{[]string{"template", "lst"}, "did you mean list?"},
		{[]string{"snapshot", "zzzzzz"}, "run `agentenv snapshot --help` for its commands"},
	} {
		out, err := run(tc.args...)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want a usage error with %q", tc.args, err, tc.want)
		}
		if out != "" {
			t.Errorf("%q: printed %q, want nothing on stdout", tc.args, out)
		}
	}
	// A group alone still shows its help.
	if out, err := run("sandbox"); err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("agentenv sandbox: got %v, output %q; want its help", err, out)
	}
}

// TestExecFlagHint: a flag of the command after the sandbox ID is an
// error that shows the command line with `--`.
func TestExecFlagHint(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "exec", "sb-1", "ls", "-la"}, "agentenv sandbox exec sb-1 -- ls -la"},
		{[]string{"--api-key", "secret", "sandbox", "exec", "--cwd", "/tmp", "-e", "A=1", "sb-1", "grep", "-r", "x y"}, "agentenv sandbox exec --cwd /tmp -e A=1 sb-1 -- grep -r 'x y'"},
		{[]string{"sandbox", "exec", "--api-key=secret", "sb-1", "ls", "-l"}, "agentenv sandbox exec --api-key=KEY sb-1 -- ls -l"},
	} {
		_, err := run(tc.args...)
		var ue *usageError
		if !errors.As(err, &ue) || !ue.dashDash {
			t.Fatalf("%q: got %v, want a usage error with the -- hint", tc.args, err)
		}
		if got := dashDashLine(ue.cmd, tc.args); got != tc.want {
			t.Errorf("%q: got hint %q, want %q", tc.args, got, tc.want)
		}
	}
	// An unknown flag before the ID leaves its place unknown: no line.
	if _, err := run("sandbox", "exec", "-xy", "sb-1", "ls"); err == nil {
		t.Error("exec -xy: no error")
	} else if ue := new(*usageError); errors.As(err, ue) && dashDashLine((*ue).cmd, []string{"sandbox", "exec", "-xy", "sb-1", "ls"}) != "" {
		t.Error("exec -xy: a command line was suggested though the ID's place is unknown")
	}
	// Flags of agentenv itself before the ID are fine; too few arguments
	// is a usage error too.
	if _, err := run("sandbox", "exec", "sb-1"); !errors.As(err, new(*usageError)) {
		t.Errorf("exec with no command: got %v, want a usage error", err)
	}
}

// TestRemotePath: docker cp's ID:PATH syntax.
func TestRemotePath(t *testing.T) {
	for _, tc := range []struct {
		arg, id, path string
		ok            bool
	}{
		{"sb-1:/tmp/x", "sb-1", "/tmp/x", true},
		{"sb-1:", "sb-1", ".", true},
		{"./a:b", "", "./a:b", false},
		{"/abs/a:b", "", "/abs/a:b", false},
		{"plain", "", "plain", false},
		{":x", "", ":x", false},
	} {
		id, path, ok := remotePath(tc.arg)
		if id != tc.id || path != tc.path || ok != tc.ok {
			t.Errorf("remotePath(%q) = %q, %q, %v; want %q, %q, %v", tc.arg, id, path, ok, tc.id, tc.path, tc.ok)
		}
	}
}

// TestEmptyJSONList: an empty list prints [], not null.
func TestEmptyJSONList(t *testing.T) {
	var b bytes.Buffer
	g := &globals{}
	var none []struct{}
	if err := g.printJSON(&b, none); err != nil || strings.TrimSpace(b.String()) != "[]" {
		t.Errorf("got %q (%v), want []", b.String(), err)
	}
}

// TestExecTimeoutFlag: seconds or a duration.
func TestExecTimeoutFlag(t *testing.T) {
	for in, want := range map[string]time.Duration{"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "2m": 2 * time.Minute, "0": 0} {
		var s seconds
		if err := s.Set(in); err != nil || time.Duration(s) != want {
			t.Errorf("--timeout %s: got %v, %v; want %v", in, time.Duration(s), err, want)
		}
	}
	if err := new(seconds).Set("soon"); err == nil {
		t.Error("--timeout soon: no error")
	}
}
