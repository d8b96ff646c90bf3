package goclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/envd"
	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/testenv"
)

// fakeSandboxes serves an envd in-process behind a stand-in for the
// proxy (502 for the sandboxes states names as not running, as the real
// one answers) and for the API's GET /sandboxes/{id}. It returns a client,
// a running sandbox and the current user's name (envd runs commands as
// that user here).
func fakeSandboxes(t *testing.T, states map[string]string) (*client.Client, client.Sandbox, string) {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	e := envd.New(envd.Config{AccessToken: "tok"}).Handler()
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st, ok := states[r.Header.Get("E2b-Sandbox-Id")]; ok && st != "running" {
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, `{"message":"The sandbox was not found","code":502}`)
			return
		}
		e.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := strings.TrimPrefix(r.URL.Path, "/sandboxes/")
		st, ok := states[id]
		if !ok || st == "gone" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"code":404,"message":"sandbox %q does not exist: it was killed at 2030-01-02 03:04:05 UTC"}`, id)
			return
		}
		fmt.Fprintf(w, `{"sandboxID":%q,"state":%q}`, id, st)
	}))
	t.Cleanup(api.Close)
	return client.New(api.URL, proxy.URL, "key"), client.Sandbox{SandboxID: "sb", EnvdAccessToken: "tok"}, u.Username
}

// Stdin streams to the process and ends with end-of-file; Kill ends it.
func TestProcessStdinAndKill(t *testing.T) {
	c, sb, me := fakeSandboxes(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "wc", Args: []string{"-c"}, User: me, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	in := strings.Repeat("x", 300_000) // several input messages
	go p.CopyStdin(ctx, strings.NewReader(in))
	res, err := p.Wait(nil, nil)
	if err != nil || strings.TrimSpace(string(res.Stdout)) != fmt.Sprint(len(in)) {
		t.Errorf("wc -c of piped input: %q, %v; want %d", res.Stdout, err, len(in))
	}
	p, err = c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "sleep", Args: []string{"100"}, User: me})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(nil, nil); err != nil || res.ExitCode != -1 {
		t.Errorf("after Kill: exit %d, %v; want -1 (a signal)", res.ExitCode, err)
	}
	p, err = c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "sleep", Args: []string{"100"}, User: me, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(nil, nil); !errors.Is(err, client.ErrProcessTimeout) {
		t.Errorf("past its timeout: %v, want ErrProcessTimeout", err)
	}
}

// CopyTo then CopyFrom gives the tree back; symlinks are skipped with a
// warning; modes come back out.
func TestCopyRoundTrip(t *testing.T) {
	c, sb, me := fakeSandboxes(t, nil)
	ctx := context.Background()
	src, remote, back := t.TempDir(), t.TempDir(), t.TempDir()
	files := map[string]string{"a": "alpha", "d/b": strings.Repeat("b", 100_000), "d/e/c": ""}
	for name, content := range files {
		p := filepath.Join(src, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(content), 0o644)
	}
	os.Symlink("a", filepath.Join(src, "link"))
	var warnings []string
	warn := func(s string) { warnings = append(warnings, s) }
	fs := c.Files(sb, me)
	if err := fs.CopyTo(ctx, src, remote+"/", warn); err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "link") {
		t.Errorf("warnings %q, want one about the symlink", warnings)
	}
	into := filepath.Join(remote, filepath.Base(src))
	os.Chmod(filepath.Join(into, "d/e/c"), 0o750)
	if err := fs.CopyFrom(ctx, into, filepath.Join(back, "copy"), warn); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if b, err := os.ReadFile(filepath.Join(back, "copy", name)); err != nil || string(b) != content {
			t.Errorf("%s after the round trip: %d bytes, %v; want %d", name, len(b), err, len(content))
		}
	}
	if st, err := os.Stat(filepath.Join(back, "copy", "d/e/c")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("mode copied out: %v, %v; want 0750", st.Mode(), err)
	}
	if err := fs.CopyTo(ctx, src, filepath.Join(into, "a"), warn); err == nil {
		t.Error("copying a directory onto a file: no error")
	}
}

// An envd request to a sandbox that is not running says why.
func TestNotRunningExplained(t *testing.T) {
	c, _, me := fakeSandboxes(t, map[string]string{"sb-paused": "paused", "sb-gone": "gone"})
	ctx := context.Background()
	_, err := c.StartProcess(ctx, client.Sandbox{SandboxID: "sb-paused"}, client.ProcessRequest{Cmd: "true", User: me})
	var nr *client.NotRunningError
	if !errors.As(err, &nr) || nr.State != "paused" || err.Error() != "sandbox sb-paused is paused: resume it with `agentenv sandbox resume sb-paused`" {
		t.Errorf("paused: got %v", err)
	}
	_, err = c.Files(client.Sandbox{SandboxID: "sb-gone"}, me).Open(ctx, "/etc/hostname")
	var ae *client.Error
	if !errors.As(err, &nr) || !errors.As(err, &ae) || ae.Status != 404 || !strings.Contains(err.Error(), "it was killed at") {
		t.Errorf("gone: got %v, want the API's 404 saying it was killed", err)
	}
}

// A process started by one client can be listed and attached to by
// another; SendStdin reaches it.
func TestListAndConnectProcess(t *testing.T) {
	c, sb, me := fakeSandboxes(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.StartProcess(ctx, sb, client.ProcessRequest{Cmd: "head", Args: []string{"-n", "1"}, User: me, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Close() // stop reading; the process goes on
	list, err := c.ListProcesses(ctx, sb)
	if err != nil || !slices.ContainsFunc(list, func(pi client.ProcessInfo) bool { return pi.PID == p.PID && pi.Cmd == "head" }) {
		t.Fatalf("ListProcesses: %+v, %v; want pid %d (head)", list, err, p.PID)
	}
	q, err := c.ConnectProcess(ctx, sb, p.PID, me)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.SendStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	res, err := q.Wait(nil, nil)
	if err != nil || string(res.Stdout) != "hello\n" || res.ExitCode != 0 {
		t.Errorf("attached process: exit %d, stdout %q, %v; want 0, %q", res.ExitCode, res.Stdout, err, "hello\n")
	}
}

// Rename moves a file, Remove deletes it.
func TestRenameRemove(t *testing.T) {
	c, sb, me := fakeSandboxes(t, nil)
	ctx := context.Background()
	dir := t.TempDir()
	fs := c.Files(sb, me)
	if err := fs.Write(ctx, dir+"/a", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	e, err := fs.Rename(ctx, dir+"/a", dir+"/b")
	if err != nil || e.Path != dir+"/b" {
		t.Fatalf("Rename: %+v, %v; want an entry at %s/b", e, err, dir)
	}
	if ok, err := fs.Exists(ctx, dir+"/b"); !ok || err != nil {
		t.Errorf("Exists of the renamed file: %v, %v; want true", ok, err)
	}
	if err := fs.Remove(ctx, dir+"/b"); err != nil {
		t.Fatal(err)
	}
	if ok, err := fs.Exists(ctx, dir+"/b"); ok || err != nil {
		t.Errorf("Exists after Remove: %v, %v; want false", ok, err)
	}
	if _, err := os.Stat(dir + "/b"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Remove: %v, want not exist", err)
	}
}

// Port routes to the sandbox's port with its traffic token; Envd with its
// envd token.
func TestPortHeaders(t *testing.T) {
	var got http.Header
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Clone() }))
	defer proxy.Close()
	c := client.New("http://api.invalid", proxy.URL, "key")
	sb := client.Sandbox{SandboxID: "sb1", EnvdAccessToken: "envd-tok", TrafficAccessToken: "traffic-tok"}
	for _, tt := range []struct {
		port              int
		header, wantToken string
	}{
		{8080, "E2b-Traffic-Access-Token", "traffic-tok"},
		{client.EnvdPort, "X-Access-Token", "envd-tok"},
	} {
		hc, base := c.Port(sb, tt.port)
		resp, err := hc.Get(base + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got.Get("E2b-Sandbox-Id") != "sb1" || got.Get("E2b-Sandbox-Port") != fmt.Sprint(tt.port) || got.Get(tt.header) != tt.wantToken {
			t.Errorf("port %d: headers %v; want sandbox sb1, port %d, %s %s", tt.port, got, tt.port, tt.header, tt.wantToken)
		}
	}
}

// EnvdPort is envd's port.
func TestEnvdPort(t *testing.T) {
	if client.EnvdPort != envdapi.Port {
		t.Errorf("EnvdPort = %d, want envdapi.Port %d", client.EnvdPort, envdapi.Port)
	}
}

// clientModule is the Go client's module, relative to this package.
const clientModule = "../../client"

// The client module builds for every OS a user may run it on, with the Go
// its go.mod names: it must not reach the server's Linux-only packages
// (the envd daemon, the sandbox manager) nor newer Go than users have.
func TestBuildsEverywhere(t *testing.T) {
	testenv.NeedCommand(t, "go", "cross-compiles the client module")
	// vet, on the host, also reports standard library calls newer than
	// the go.mod's Go release.
	for _, c := range []struct{ dir, goos, args string }{
		{clientModule, "darwin", "build -o " + os.DevNull + " ./..."},
		{clientModule, "windows", "build -o " + os.DevNull + " ./..."},
		{clientModule, "", "vet ./..."},
	} {
		cmd := exec.Command("go", strings.Fields(c.args)...)
		cmd.Dir = c.dir
		cmd.Env = append(cmd.Environ(), "GOARCH=amd64", "CGO_ENABLED=0", "GOFLAGS=-mod=readonly")
		if c.goos != "" {
			cmd.Env = append(cmd.Env, "GOOS="+c.goos)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go %s in %s: %v\n%s", c.goos, c.args, c.dir, err, out)
		}
	}
}

// serverModules are module path prefixes a client user must not pull:
// the server's runtime, store, cluster and firewall dependencies, and the
// server's own module.
var serverModules = []string{"gvisor.dev/", "go.etcd.io/", "k8s.io/", "sigs.k8s.io/",
	"github.com/vishvananda/", "github.com/google/nftables", "github.com/prometheus/", "github.com/spf13/"}

// TestClientModuleIsSmall checks that the client module requires no
// server dependency (so `go get .../client` pulls none), not the server's
// own module, and names a Go release users have.
func TestClientModuleIsSmall(t *testing.T) {
	testenv.NeedCommand(t, "go", "lists the client module's requirements")
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Path}}", "all")
	cmd.Dir = clientModule
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all in client/: %v\n%s", err, out)
	}
	mods := strings.Fields(string(out))
	for _, m := range mods {
		if m == "github.com/agentenv/agentenv" {
			t.Errorf("the client module requires the server's module %s: move the types it needs into the api module", m)
		}
		for _, p := range serverModules {
			if strings.HasPrefix(m, p) {
				t.Errorf("the client module pulls %s, a server dependency", m)
			}
		}
	}
	t.Logf("client module: %d modules in go list -m all", len(mods))
	cmd = exec.Command("go", "mod", "edit", "-json")
	cmd.Dir = clientModule
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var mod struct{ Go string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	minor, _, _ := strings.Cut(strings.TrimPrefix(mod.Go, "1."), ".")
	if n, err := strconv.Atoi(minor); err != nil || !strings.HasPrefix(mod.Go, "1.") || n > 22 {
		t.Errorf("client/go.mod says go %s, want 1.22 or older: users build the client with the Go they have", mod.Go)
	}
}
