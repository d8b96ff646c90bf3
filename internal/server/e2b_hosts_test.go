package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// needLocalhostNames fails (in CI) or skips the test when names under
// .localhost do not resolve to loopback through libc, as the SDKs resolve
// them: make setup installs nss-myhostname for that.
func needLocalhostNames(t *testing.T) {
	t.Helper()
	if localhostNamesResolve() {
		return
	}
	msg := "*." + testDomain + " does not resolve to loopback: install libnss-myhostname and list myhostname in the hosts line of /etc/nsswitch.conf (make setup does both)"
	if testenv.Required() {
		t.Fatal(msg)
	}
	t.Skip("skipping: " + msg)
}

// TestE2BHosts runs tests/e2b/hosts.test.mjs: the official e2b SDK
// without E2B_SANDBOX_URL, reaching envd and sandbox ports at
// https://<port>-<id>.<domain> with only the server's local CA trusted;
// signed file URLs both by host and on E2B_SANDBOX_URL; auto-resume by an
// HTTPS request.
func TestE2BHosts(t *testing.T) {
	e := sharedServer(t)
	needLocalhostNames(t)
	node := testenv.NeedCommand(t, "node", "the e2b SDK test needs Node.js")
	dir := filepath.Join(testenv.RepoRoot(), "tests", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
		t.Fatalf("tests/e2b/node_modules/e2b missing: make setup installs it (npm ci)")
	}
	cmd := exec.Command(node, "--test", "--test-reporter=spec", "hosts.test.mjs")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "NODE_EXTRA_CA_CERTS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "E2B_API_URL="+e.api, "E2B_API_KEY="+e.key,
		"NODE_EXTRA_CA_CERTS="+filepath.Join(e.dataDir, "ca.pem"), "AGENTENV_PLAIN_PROXY="+e.proxy)
	out, err := cmd.CombinedOutput()
	t.Logf("node --test hosts.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("e2b SDK host tests failed: %v", err)
	}
}

// localhostNamesResolve reports whether libc resolves a sandbox host under
// testDomain to loopback (getent: the resolver Node and Python use).
func localhostNamesResolve() bool {
	// ahosts, not ahostsv4: in a namespace with only lo, glibc finds no
	// IPv4-only answer (AI_ADDRCONFIG), while clients get ::1 and 127.0.0.1.
	out, err := exec.Command("getent", "ahosts", "8000-probe."+testDomain).Output()
	return err == nil && (strings.HasPrefix(string(out), "127.") || strings.HasPrefix(string(out), "::1 "))
}
