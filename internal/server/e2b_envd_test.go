package server_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestE2BEnvd runs tests/e2b/envd.test.mjs: the official e2b SDK against
// envd's 0.6.x features (file metadata, watch options and events, EntryInfo
// details, signed URL errors, PTYs) in a real sandbox.
func TestE2BEnvd(t *testing.T) { runSDKTest(t, sharedServer(t), "envd.test.mjs") }

// TestSandboxShellCLI drives `agentenv sandbox shell ID` with piped input:
// the CLI finds the sandbox through the API and runs a login shell on a PTY
// in it through the proxy; the shell's exit code is the command's.
func TestSandboxShellCLI(t *testing.T) {
	e := sharedServer(t)
	bin := testenv.BuildAgentenv(t, t.TempDir())
	sb := e.create(t, client.CreateRequest{})
	cmd := exec.Command(bin, "--server", e.api, "--proxy", e.proxy, "--api-key", e.key, "sandbox", "shell", sb.SandboxID)
	cmd.Stdin = strings.NewReader("echo from-$((6*7)) as $(id -un); stty size\nexit 5\n")
	out, err := cmd.CombinedOutput()
	t.Logf("agentenv sandbox shell output:\n%s", out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 {
		t.Fatalf("got %v, want exit status 5 (the shell's); output:\n%s", err, out)
	}
	for _, want := range []string{"from-42 as user", "24 80"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q (default user, default 80x24 PTY):\n%s", want, out)
		}
	}
}
