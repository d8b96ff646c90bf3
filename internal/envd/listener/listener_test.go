package listener

import (
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// The init runs only in a sandbox's pid 1; open is what it calls there
// (here on a free port: envd's own may be in use by tests running beside).
func TestOpenListensAndTakeHandsOver(t *testing.T) {
	f := open(0)
	if f == nil {
		t.Fatal("open(0) opened no socket")
	}
	early = f
	got := Take()
	if got != f {
		t.Fatalf("Take() = %v, want the socket open made", got)
	}
	if again := Take(); again != nil {
		t.Fatalf("second Take() = %v, want nil", again)
	}
	ln, err := net.FileListener(got)
	got.Close()
	if err != nil {
		t.Fatalf("FileListener: %v", err)
	}
	defer ln.Close()
	addr := ln.Addr().(*net.TCPAddr)
	if !addr.IP.IsUnspecified() || addr.Port == 0 {
		t.Fatalf("listening on %s, want 0.0.0.0 and a port", addr)
	}
	// A connection made before anyone accepts waits in the backlog.
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(addr.Port)))
	if err != nil {
		t.Fatalf("dial before accept: %v", err)
	}
	c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	s.Close()
}

// The package's init must precede the heavy ones: it may import nothing
// beyond the runtime's, syscall's and os's own dependencies, and only
// cmd/envd may import it (an agentenv process that is pid 1 must not
// listen on envd's port).
func TestListenerStaysTiny(t *testing.T) {
	testenv.NeedCommand(t, "go", "lists the package's importers")
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", "github.com/agentenv/agentenv/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		pkg, imports, _ := strings.Cut(line, ": ")
		for _, imp := range strings.Fields(imports) {
			if imp == "github.com/agentenv/agentenv/internal/envd/listener" && pkg != "github.com/agentenv/agentenv/cmd/envd" {
				t.Errorf("%s imports the listener: only cmd/envd may", pkg)
			}
		}
		if pkg == "github.com/agentenv/agentenv/internal/envd/listener" {
			for _, imp := range strings.Fields(imports) {
				// envdapi holds constants and imports nothing (its own test checks).
				if imp != "os" && imp != "syscall" && imp != "github.com/agentenv/agentenv/internal/envdapi" {
					t.Errorf("the listener imports %s: only os, syscall and envdapi keep its init early", imp)
				}
			}
		}
	}
}
