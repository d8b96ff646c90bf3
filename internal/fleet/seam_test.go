package fleet

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

const (
	restPkg    = "github.com/agentenv/agentenv/internal/api"
	servicePkg = "github.com/agentenv/agentenv/internal/service"
)

// goListDeps maps each package matching pattern to its imports and to
// every package it depends on (test files aside).
func goListDeps(t *testing.T, pattern string) (imports, deps map[string][]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \" \"}}|{{join .Deps \" \"}}", pattern)
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pattern, err)
	}
	imports, deps = map[string][]string{}, map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "|")
		if len(parts) != 3 {
			t.Fatalf("go list: unexpected line %q", line)
		}
		imports[parts[0]], deps[parts[0]] = strings.Fields(parts[1]), strings.Fields(parts[2])
	}
	return imports, deps
}

// TestFleetStandsOnTheSeam: no package of the fleet depends on the REST
// API, directly or through another package; they call the service seam,
// which is below REST (REST imports it, it imports neither REST nor the
// fleet).
func TestFleetStandsOnTheSeam(t *testing.T) {
	testenv.NeedCommand(t, "go", "lists the fleet's dependencies")
	_, deps := goListDeps(t, "github.com/agentenv/agentenv/internal/fleet/...")
	if len(deps) < 5 {
		t.Fatalf("go list found only %d fleet packages", len(deps))
	}
	for pkg, d := range deps {
		if slices.Contains(d, restPkg) {
			t.Errorf("%s depends on the REST API (%s): use the service seam (%s) instead", pkg, restPkg, servicePkg)
		}
	}
	imports, deps := goListDeps(t, restPkg)
	if !slices.Contains(imports[restPkg], servicePkg) {
		t.Errorf("%s does not import %s: the REST API calls the seam", restPkg, servicePkg)
	}
	_, deps = goListDeps(t, servicePkg)
	for _, d := range deps[servicePkg] {
		if d == restPkg || strings.HasPrefix(d, "github.com/agentenv/agentenv/internal/fleet") {
			t.Errorf("%s depends on %s: the seam must stay below the front ends and the fleet", servicePkg, d)
		}
	}
}
