package server_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"agentenv/internal/childproc"
	"agentenv/internal/client"
	"agentenv/internal/testenv"
)

// TestE2BEnvd runs tests/e2b/envd.test.mjs: the official e2b SDK against
// envd's 0.6.x features (file metadata, watch options and events, EntryInfo
// details, signed URL errors, PTYs) in a real sandbox.
func TestE2BEnvd(t *testing.T) {
	e := sharedServer(t)
	node := testenv.NeedCommand(t, "node", "the e2b SDK test needs Node.js")
	dir := filepath.Join(testenv.RepoRoot(), "tests", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		if testenv.Required() {
			t.Fatalf("tests/e2b/node_modules/e2b missing: make setup installs it (npm ci)")
		}
		t.Skip("skipping: run `make setup` to install the e2b SDK (npm ci in tests/e2b)")
	}
	cmd := exec.Command(node, "--test", "--test-reporter=spec", "envd.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+e.api, "E2B_SANDBOX_URL="+e.proxy, "E2B_API_KEY="+e.key, "E2B_DEBUG=")
	out, err := childproc.CombinedOutput(cmd)
	t.Logf("node --test output:\n%s", out)
	if err != nil {
		t.Fatalf("envd parity tests failed: %v", err)
	}
}

// TestSandboxShellCLI drives `agentenv sandbox shell ID` with piped input:
// the CLI finds the sandbox through the API and runs a login shell on a PTY
// in it through the proxy; the shell's exit code is the command's.
func TestSandboxShellCLI(t *testing.T) {
	e := sharedServer(t)
	bin := testenv.BuildAgentenv(t, t.TempDir())
	sb := e.create(t, client.CreateRequest{})
	cmd := exec.Command(bin, "--server", e.api, "--proxy", e.proxy, "--api-key", e.key, "sandbox", "shell", sb.SandboxID)
	cmd.Stdin = strings.NewReader("echo from-$((6*7)) as $(id -un); stty size\nexit 5\n")
	out, err := childproc.CombinedOutput(cmd)
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
