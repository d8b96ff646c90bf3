package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/cli"
	"github.com/agentenv/agentenv/internal/template/ocitest"
)

// runCLI runs `agentenv --json ARGS` against the server in this process.
func (e *env) runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := cli.Root()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--server", e.api, "--proxy", e.proxy, "--api-key", testKey, "--json"}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// buildCLI builds a template with the CLI and deletes it when the test ends.
func (e *env) buildCLI(t *testing.T, name string, args ...string) client.Template {
	t.Helper()
	out, err := e.runCLI(t, append([]string{"template", "build", name}, args...)...)
	if err != nil {
		t.Fatalf("agentenv template build %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), name) })
	var tpl client.Template
	if err := json.Unmarshal([]byte(out), &tpl); err != nil {
		t.Fatalf("build output %q: %v", out, err)
	}
	return tpl
}

// busyboxImage is an OCI image on a busybox base layer: a layer with files
// a and b and a symlink, and a layer above that deletes b (a whiteout).
func busyboxImage(t *testing.T, cfg v1.Config) v1.Image {
	base := ocitest.Layer(t, ocitest.Busybox(t)...)
	lower := ocitest.Layer(t,
		ocitest.Dir("data", 0o755),
		ocitest.File("data/a", "alpha\n", 0o644),
		ocitest.File("data/b", "beta\n", 0o644),
		ocitest.Symlink("data/link", "a"),
		ocitest.Entry{Name: "data/owned", Body: []byte("o\n"), Mode: 0o600, UID: 1500, GID: 1500},
	)
	upper := ocitest.Layer(t, ocitest.Whiteout("data/b"), ocitest.File("data/c", "gamma\n", 0o644))
	return ocitest.Image(t, cfg, base, lower, upper)
}

// TestOCITemplate: `template build --oci` of an image layout directory and
// of a docker save tarball gives sandboxes that see exactly the image's
// files (the whiteout applied, the symlink kept) and run commands with the
// image's env, working directory and user.
func TestOCITemplate(t *testing.T) {
	e := sharedServer(t)
	img := busyboxImage(t, v1.Config{Env: []string{"PATH=/bin", "GREETING=hello from oci"}, WorkingDir: "/srv/app", User: "app"})
	dir := t.TempDir()
	ocitest.WriteLayout(t, img, filepath.Join(dir, "layout"))
	ocitest.WriteDockerSave(t, img, filepath.Join(dir, "save.tar"), "example.test/oci:1")
	for _, src := range []string{"layout", "save.tar"} {
		t.Run(src, func(t *testing.T) {
			name := "oci-" + strings.ReplaceAll(src, ".", "-")
			tpl := e.buildCLI(t, name, "--oci", filepath.Join(dir, src))
			if want := "oci:" + filepath.Join(dir, src); tpl.Source != want || tpl.User != "app" || tpl.Workdir != "/srv/app" || tpl.Env["GREETING"] != "hello from oci" {
				t.Errorf("template = %+v, want source %s, user app, workdir /srv/app and the image's env", tpl, want)
			}
			sb := e.create(t, client.CreateRequest{TemplateID: name})
			res := e.sh(t, sb, `ls -A /; echo --; ls -A /data; echo --; readlink /data/link; cat /data/link; `+
				`stat -c '%a %u %g' /data/owned; echo --; pwd; id -un; echo "$GREETING"; echo "$PATH"`)
			want := ".agentenv\nbin\ndata\ndev\netc\nhome\nproc\nroot\nsrv\nsys\ntmp\n--\n" +
				"a\nc\nlink\nowned\n--\na\nalpha\n600 1500 1500\n--\n" +
				"/srv/app\napp\nhello from oci\n/bin\n"
			if got := string(res.Stdout); got != want || res.ExitCode != 0 {
				t.Errorf("in the sandbox (exit %d, stderr %q):\n%s\nwant:\n%s", res.ExitCode, res.Stderr, got, want)
			}
		})
	}
}

// TestTemplateStartCmd: a template's start command runs at build until
// its ready check passes; sandboxes of the template start with it running.
func TestTemplateStartCmd(t *testing.T) {
	e := sharedServer(t)
	dir := t.TempDir()
	ocitest.WriteLayout(t, busyboxImage(t, v1.Config{}), dir)
	// The start command leaves a random token: sandboxes restored from the
	// ready snapshot all see the one it wrote at build.
	tpl := e.buildCLI(t, "oci-start", "--oci", dir,
		"--start-cmd", "od -An -N8 -tx1 /dev/urandom | tr -d ' ' > /tmp/started; exec sleep 1000", "--ready-cmd", "test -s /tmp/started")
	if tpl.StartCmd == "" || tpl.ReadyCmd != "test -s /tmp/started" || !tpl.Ready {
		t.Errorf("template = %+v, want its start and ready commands, ready", tpl)
	}
	var tokens []string
	for i := 0; i < 2; i++ {
		sb := e.create(t, client.CreateRequest{TemplateID: "oci-start"})
		res := e.sh(t, sb, `cat /tmp/started; pidof sleep >/dev/null && echo running`)
		token, rest, _ := strings.Cut(string(res.Stdout), "\n")
		if len(token) != 16 || rest != "running\n" {
			t.Errorf("sandbox %d: got %q (stderr %q), want a token and \"running\"", i, res.Stdout, res.Stderr)
		}
		tokens = append(tokens, token)
	}
	if tokens[0] != tokens[1] {
		t.Errorf("sandboxes saw start tokens %q: want the one written at build (the ready snapshot's)", tokens)
	}
}

// TestTemplateStartCmdFails: a start command that exits, or a ready check
// that never passes, fails the build with a clear error holding the
// command's output, and leaves no template and no sandbox behind.
func TestTemplateStartCmdFails(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	dir := t.TempDir()
	ocitest.WriteLayout(t, busyboxImage(t, v1.Config{}), dir)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"oci-start-exits", []string{"--start-cmd", "echo boom-output; exit 3"}, []string{"exit status 3", "boom-output"}},
		{"oci-never-ready", []string{"--start-cmd", "echo waiting-output; exec sleep 1000", "--ready-cmd", "test -f /nonexistent", "--ready-timeout", "2"},
			[]string{"did not pass within 2s", "waiting-output", "test -f /nonexistent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := e.runCLI(t, append([]string{"template", "build", tc.name, "--oci", dir}, tc.args...)...)
			if err == nil {
				e.client.DeleteTemplate(ctx, tc.name)
				t.Fatalf("build succeeded (%s), want it to fail", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			tpls, _ := e.client.ListTemplates(ctx)
			for _, tpl := range tpls {
				if tpl.TemplateID == tc.name {
					t.Errorf("template %s kept after a failed start command", tc.name)
				}
			}
			sbs, _ := e.client.ListSandboxes(ctx, nil)
			for _, sb := range sbs {
				if sb.TemplateID == tc.name {
					t.Errorf("sandbox %s of the failed template left running", sb.SandboxID)
				}
			}
		})
	}
}
