package server_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestSetuidBinariesWork: E2B's templates give user passwordless sudo,
// which needs the sandbox's kernel to honour setuid bits (runsc
// --allow-suid). A setuid-root program run by user gets euid 0.
func TestSetuidBinariesWork(t *testing.T) {
	e := sharedServer(t)
	goBin := testenv.NeedCommand(t, "go", "builds a tiny setuid test program")
	dir := t.TempDir()
	src := filepath.Join(dir, "euid.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(os.Getuid(), os.Geteuid()) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "euid")
	build := exec.Command(goBin, "build", "-o", bin, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}

	sb := e.create(t, client.CreateRequest{})
	user, root := e.envdAs(t, sb, "user"), e.envdAs(t, sb, "root")
	if status, msg := root.files("POST", "/opt/euid", string(prog)); status != 200 {
		t.Fatalf("upload: HTTP %d: %s", status, msg)
	}
	root.sh("chown 0:0 /opt/euid && chmod 4755 /opt/euid")
	if got := strings.TrimSpace(user.sh("/opt/euid")); got != "1000 0" {
		t.Errorf("a setuid-root program run by user printed uid, euid %q, want \"1000 0\"", got)
	}
	root.sh("chmod 0755 /opt/euid")
	if got := strings.TrimSpace(user.sh("/opt/euid")); got != "1000 1000" {
		t.Errorf("without the setuid bit: got %q, want \"1000 1000\"", got)
	}
}
