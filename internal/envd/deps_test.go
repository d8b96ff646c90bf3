package envd_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// allowedDeps are the only non-standard packages the in-sandbox daemon may
// link: it must stay a small static binary.
var allowedDeps = []string{
	"github.com/agentenv/agentenv/cmd/envd",
	"github.com/agentenv/agentenv/internal/envd",
	"github.com/agentenv/agentenv/client/api/envd",  // its generated protocol code
	"github.com/agentenv/agentenv/internal/envdapi", // what it shares with the host
	"connectrpc.com/connect",
	"google.golang.org/protobuf",
	"golang.org/x/sys",
}

// bannedDeps must never reach envd, even through an allowed package.
var bannedDeps = []string{
	"github.com/agentenv/agentenv/internal/sandbox",
	"github.com/agentenv/agentenv/internal/envdclient",
	"github.com/agentenv/agentenv/internal/dialer",
	"github.com/agentenv/agentenv/internal/runtime",
	"github.com/agentenv/agentenv/internal/api",
	"github.com/agentenv/agentenv/internal/server",
	"github.com/agentenv/agentenv/internal/proxy",
	"github.com/agentenv/agentenv/internal/template",
	"github.com/agentenv/agentenv/internal/netns",
	"github.com/agentenv/agentenv/internal/cli",
	"github.com/agentenv/agentenv/client",
	"github.com/agentenv/agentenv/internal/bench",
	"github.com/agentenv/agentenv/internal/testenv",
	"github.com/vishvananda",
	"github.com/spf13",
	"github.com/opencontainers",
	"gvisor.dev",
}

func underAny(pkg string, prefixes []string) bool {
	for _, p := range prefixes {
		if pkg == p || strings.HasPrefix(pkg, p+"/") {
			return true
		}
	}
	return false
}

func TestEnvdDependencies(t *testing.T) {
	testenv.NeedCommand(t, "go", "lists the daemon's dependencies")
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", "github.com/agentenv/agentenv/cmd/envd")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, std, _ := strings.Cut(line, " ")
		seen++
		// The client module's envd protocol code is allowed; the client is not.
		if underAny(pkg, bannedDeps) && !underAny(pkg, allowedDeps) {
			t.Errorf("envd depends on %s: the in-sandbox daemon must not link the host side", pkg)
			continue
		}
		if std == "true" {
			continue
		}
		if !underAny(pkg, allowedDeps) {
			t.Errorf("envd depends on %s: only the standard library, %s are allowed", pkg, strings.Join(allowedDeps[1:], ", "))
		}
	}
	if seen < 10 {
		t.Fatalf("go list returned only %d packages: %s", seen, out)
	}
}
