package template

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentenv/agentenv/internal/template/ocitest"
)

// testImage is two layers: the upper one deletes data/b (whiteout) and
// everything old/ had (opaque directory), and adds data/c and old/y.
func testImage(t *testing.T) v1.Image {
	lower := ocitest.Layer(t,
		ocitest.Dir("data", 0o755),
		ocitest.File("data/a", "A", 0o644),
		ocitest.File("data/b", "B", 0o644),
		ocitest.Symlink("data/link", "a"),
		ocitest.Entry{Name: "data/owned", Body: []byte("O"), Mode: 0o640, UID: 1500, GID: 1500},
		ocitest.Dir("old", 0o755),
		ocitest.File("old/x", "X", 0o644),
	)
	upper := ocitest.Layer(t,
		ocitest.Whiteout("data/b"),
		ocitest.File("data/c", "C", 0o600),
		ocitest.File("old/.wh..wh..opq", "", 0o644),
		ocitest.File("old/y", "Y", 0o644),
	)
	return ocitest.Image(t, v1.Config{Env: []string{"PATH=/opt/bin:/bin", "GREETING=a=b"}, WorkingDir: "/srv/app", User: "app"}, lower, upper)
}

// TestOCIImageFlattens: an image read from an OCI layout directory and
// from a docker save tarball flattens into exactly its files (whiteouts
// and opaque directories applied, symlinks, modes and owners kept), and
// its config gives the template's defaults.
func TestOCIImageFlattens(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("unpacking files owned by other users needs root")
	}
	img := testImage(t)
	dir := t.TempDir()
	ocitest.WriteLayout(t, img, filepath.Join(dir, "layout"))
	ocitest.WriteDockerSave(t, img, filepath.Join(dir, "save.tar"), "example.test/app:1")
	for _, src := range []string{"layout", "save.tar"} {
		t.Run(src, func(t *testing.T) {
			got, err := OpenOCI(filepath.Join(dir, src))
			if err != nil {
				t.Fatal(err)
			}
			d, err := ImageDefaults(got)
			if err != nil {
				t.Fatal(err)
			}
			if d.Workdir != "/srv/app" || d.User != "app" || d.Env["PATH"] != "/opt/bin:/bin" || d.Env["GREETING"] != "a=b" {
				t.Errorf("defaults = %+v, want the image's workdir, user and env", d)
			}
			root := t.TempDir()
			r := FlattenImage(got)
			defer r.Close()
			if _, err := ExtractTar(context.Background(), r, root, 0); err != nil {
				t.Fatal(err)
			}
			var files []string
			filepath.WalkDir(root, func(p string, _ os.DirEntry, _ error) error {
				rel, _ := filepath.Rel(root, p)
				files = append(files, rel)
				return nil
			})
			if got, want := strings.Join(files, " "), ". data data/a data/c data/link data/owned old old/y"; got != want {
				t.Errorf("files = %s, want %s", got, want)
			}
			if l, err := os.Readlink(filepath.Join(root, "data/link")); err != nil || l != "a" {
				t.Errorf("data/link -> %q (%v), want a symlink to a", l, err)
			}
			st, err := os.Lstat(filepath.Join(root, "data/owned"))
			if err != nil {
				t.Fatal(err)
			}
			if sys := st.Sys().(*syscall.Stat_t); st.Mode().Perm() != 0o640 || sys.Uid != 1500 || sys.Gid != 1500 {
				t.Errorf("data/owned: mode %v uid %d gid %d, want 0640 1500 1500", st.Mode().Perm(), sys.Uid, sys.Gid)
			}
		})
	}
}

// TestOpenOCIRefusesOtherInput: a path that is no image says what it wants.
func TestOpenOCIRefusesOtherInput(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "junk.tar"), []byte("not a tarball"), 0o644)
	for _, p := range []string{dir, filepath.Join(dir, "junk.tar"), filepath.Join(dir, "missing")} {
		if _, err := OpenOCI(p); err == nil {
			t.Errorf("OpenOCI(%s) = nil error, want one", p)
		}
	}
}

func TestSettingsCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  BuildRequest
		want string // "" = valid
	}{
		{"ok", BuildRequest{Defaults: Defaults{Env: map[string]string{"A": "1"}, Workdir: "/w", User: "1000:1000"}, Start: Start{StartCmd: "x", ReadyCmd: "y", ReadyTimeout: 5}}, ""},
		{"env key", BuildRequest{Defaults: Defaults{Env: map[string]string{"A=B": "1"}}}, "variable name"},
		{"reserved env", BuildRequest{Defaults: Defaults{Env: map[string]string{"E2B_SANDBOX_ID": "x"}}}, "set by agentenv"},
		{"relative workdir", BuildRequest{Defaults: Defaults{Workdir: "app"}}, "absolute"},
		{"bad user", BuildRequest{Defaults: Defaults{User: "a b"}}, "user name or uid"},
		{"ready without start", BuildRequest{Start: Start{ReadyCmd: "true"}}, "needs a startCmd"},
		{"timeout", BuildRequest{Start: Start{StartCmd: "x", ReadyTimeout: 4000}}, "readyTimeout"},
		{"image label without upload", BuildRequest{Image: "x"}, "only with an uploaded rootfs"},
	} {
		err := checkSettings(tc.req)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestResolveUser(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\napp:x:1500:1500::/home/app:/bin/sh\n"), 0o644)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, tc := range []struct{ spec, want string }{{"app", "app"}, {"1500", "app"}, {"app:staff", "app"}, {"0", "root"}, {"4242:4243", "uid4242"}} {
		got, err := resolveUser(root, tc.spec)
		if err != nil || got != tc.want {
			t.Errorf("resolveUser(%q) = %q, %v; want %q", tc.spec, got, err, tc.want)
		}
	}
	if b, _ := root.ReadFile("etc/passwd"); !strings.Contains(string(b), "uid4242:x:4242:4243:") {
		t.Errorf("passwd has no entry for uid 4242:\n%s", b)
	}
	if _, err := resolveUser(root, "nobody"); err == nil || !strings.Contains(err.Error(), "not in the image's /etc/passwd") {
		t.Errorf("resolveUser(nobody) err = %v, want not in passwd", err)
	}
}

// TestPullImage: --image pulls from a registry. The registry is
// go-containerregistry's in-memory one on loopback (no outside traffic).
func TestPullImage(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("unpacking files owned by other users needs root")
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/app:1"
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, testImage(t)); err != nil {
		t.Fatal(err)
	}
	img, err := PullImage(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := ImageDefaults(img); err != nil || d.User != "app" {
		t.Errorf("defaults = %+v, %v; want the image's", d, err)
	}
	root := t.TempDir()
	r := FlattenImage(img)
	defer r.Close()
	if _, err := ExtractTar(context.Background(), r, root, 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "data/c")); err != nil || string(b) != "C" {
		t.Errorf("data/c = %q, %v; want C", b, err)
	}
	if _, err := PullImage(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/test/missing:1"); err == nil {
		t.Error("pulling a missing image: nil error")
	}
}
