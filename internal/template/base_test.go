package template_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestBasePackages checks the package list of the demo's template "base"
// (scripts/base-packages, which scripts/demo.sh builds): it offers what
// E2B's default template offers code (python, pip, venv, node, npm) and a
// build request with it is valid. Building base takes debootstrap 10 to 30
// minutes and the Debian mirror, which tests may not reach: `make demo`
// builds it and checks that python -c, pip --version, node -e and npm run.
func TestBasePackages(t *testing.T) {
	root := testenv.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "scripts", "base-packages"))
	if err != nil {
		t.Fatal(err)
	}
	// Parsed as demo.sh does: '#' starts a comment, blank lines are skipped.
	var pkgs []string
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			pkgs = append(pkgs, line)
		}
	}
	for _, want := range []string{"python3", "python-is-python3", "python3-pip", "python3-venv", "nodejs", "npm"} {
		if !slices.Contains(pkgs, want) {
			t.Errorf("scripts/base-packages lacks %s", want)
		}
	}
	demo, err := os.ReadFile(filepath.Join(root, "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"scripts/base-packages", `--packages "$PACKAGES"`, "python -c", "pip --version", "node -e"} {
		if !strings.Contains(string(demo), want) {
			t.Errorf("scripts/demo.sh does not contain %q: it must build base from the list and check it", want)
		}
	}
	dir := t.TempDir()
	envd := filepath.Join(dir, "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	store, err := template.Open(filepath.Join(dir, "templates"), envd, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Validate(template.BuildRequest{Name: "base", Debian: "bookworm", Packages: pkgs}); err != nil {
		t.Errorf("a build of base with scripts/base-packages is refused: %v", err)
	}
}
