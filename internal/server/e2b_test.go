package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestE2BSDK runs the official e2b npm SDK (pinned in tests/e2b) against the
// server, the way a user points it at agentenv: E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY.
func TestE2BSDK(t *testing.T) { runSDKTest(t, sharedServer(t), "sdk.test.mjs") }

// runSDKTest runs one tests/e2b/*.test.mjs (by name: `node --test` alone
// would run them all) with the SDK pointed at e, and extra environment
// (KEY=VALUE) the test needs.
func runSDKTest(t *testing.T, e *env, file string, extra ...string) {
	t.Helper()
	node := testenv.NeedCommand(t, "node", "the e2b SDK test needs Node.js")
	dir := filepath.Join(testenv.RepoRoot(), "tests", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		if testenv.Required() {
			t.Fatalf("tests/e2b/node_modules/e2b missing: make setup installs it (npm ci)")
		}
		t.Skip("skipping: run `make setup` to install the e2b SDK (npm ci in tests/e2b)")
	}
	cmd := exec.Command(node, "--test", "--test-reporter=spec", file)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+e.api, "E2B_SANDBOX_URL="+e.proxy, "E2B_API_KEY="+e.key, "E2B_DEBUG=",
		// The SDK's volume content client does not read E2B_API_URL.
		"E2B_VOLUME_API_URL="+e.api)
	cmd.Env = append(cmd.Env, extra...)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test %s:\n%s", file, out)
	if err != nil {
		t.Fatalf("e2b SDK tests in %s failed: %v", file, err)
	}
}
