package server_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// python3 returns the interpreter the Python SDK's tests run with, or
// skips: the SDK is standard library only, so a bare python3 is enough.
func python3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("AGENTENV_REQUIRE_ROOT") == "1" {
			t.Fatal("python3 is not installed (scripts/setup.sh installs it); the Python SDK tests need it")
		}
		t.Skip("python3 is not installed; skipping the Python SDK tests")
	}
	return p
}

// runPython runs args with the SDK on the path and the shared server's
// addresses in E2B's and agentenv's variables, and returns its output.
func runPython(t *testing.T, e *env, dir string, extraEnv []string, args ...string) string {
	t.Helper()
	sdk, err := filepath.Abs("../../sdk/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python3(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+sdk, "PYTHONUNBUFFERED=1", "PYTHONDONTWRITEBYTECODE=1",
		"E2B_API_URL="+e.api, "E2B_SANDBOX_URL="+e.proxy, "E2B_API_KEY="+e.key,
		"AGENTENV_TEMPLATE=busybox")
	cmd.Env = append(cmd.Env, extraEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("%s (%.1fs):\n%s", strings.Join(args, " "), time.Since(start).Seconds(), out.String())
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return out.String()
}

// TestPythonSDK runs the Python SDK's unittest suite against a real server.
func TestPythonSDK(t *testing.T) {
	e := sharedServer(t)
	sdk, _ := filepath.Abs("../../sdk/python")
	args := []string{"-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."}
	if k := os.Getenv("AGENTENV_PY_TEST_PATTERN"); k != "" {
		args = append(args, "-k", k) // while working on one test
	}
	// test_hosts.py reaches sandboxes at https://<port>-<id>.<domain>,
	// trusting the server's CA only; it fails rather than skips when
	// AGENTENV_REQUIRE_HOSTS is set.
	extra := []string{"SSL_CERT_FILE=" + filepath.Join(e.dataDir, "ca.pem")}
	if localhostNamesResolve() || testenv.Required() {
		extra = append(extra, "AGENTENV_REQUIRE_HOSTS=1")
	}
	runPython(t, e, sdk, extra, args...)
}

// TestPythonExamples runs the examples at small size; each prints its
// results, and fails if no rollout or branch fixed the bug. They run a
// real unittest suite with the "python" template (busybox plus the host's
// python3, built by examples/python_template.py on first use).
func TestPythonExamples(t *testing.T) {
	e := sharedServer(t)
	ex, _ := filepath.Abs("../../examples")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"rollouts", []string{"parallel_rollouts.py", "--rollouts", "8", "--parallel", "8"}, "rollouts/s"},
		{"tree search", []string{"tree_search.py", "--branches", "4"}, "best branch"},
		{"e2b names", []string{"e2b_rollouts.py", "--rollouts", "4", "--parallel", "4"}, "rollouts/s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runPython(t, e, ex, nil, c.args...)
			if !strings.Contains(out, c.want) {
				t.Errorf("output lacks %q", c.want)
			}
		})
	}
}
