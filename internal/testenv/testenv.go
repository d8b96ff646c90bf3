// Package testenv holds helpers for tests that need root, gVisor or other
// parts of the host. Locally such tests skip with a reason; with
// AGENTENV_REQUIRE_ROOT=1 (set by `make test` and CI) a missing requirement
// fails the test instead, so CI can never pass by skipping.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Required reports whether missing requirements must fail tests.
func Required() bool { return os.Getenv("AGENTENV_REQUIRE_ROOT") == "1" }

func missing(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("requirement missing (AGENTENV_REQUIRE_ROOT=1): %s", reason)
	}
	t.Skipf("skipping: %s (run `make test` as root to run it)", reason)
}

// NeedRoot skips (or fails, in CI) unless the test runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if testing.Short() && !Required() {
		t.Skip("skipping in -short mode: needs root")
	}
	if os.Geteuid() != 0 {
		missing(t, "needs root")
	}
}

// NeedRunsc skips (or fails) unless root and runsc are available, and
// returns the runsc path.
func NeedRunsc(t testing.TB) string {
	t.Helper()
	NeedRoot(t)
	p, err := exec.LookPath("runsc")
	if err != nil {
		missing(t, "needs runsc (make setup installs the pinned build)")
	}
	return p
}

// NeedCommand skips (or fails) unless a command is on PATH.
func NeedCommand(t testing.TB, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" not found: "+why)
	}
	return p
}

// RepoRoot returns the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// BuildEnvd builds the envd binary into dir and returns its path.
func BuildEnvd(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "envd")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/envd")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build envd: %v\n%s", err, b)
	}
	return out
}

// BuildAgentenv builds the agentenv binary (and envd next to it) into dir
// and returns the agentenv path.
func BuildAgentenv(t testing.TB, dir string) string {
	t.Helper()
	BuildEnvd(t, dir)
	out := filepath.Join(dir, "agentenv")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/agentenv")
	cmd.Dir = RepoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agentenv: %v\n%s", err, b)
	}
	return out
}
