package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"agentenv/internal/childproc"
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
