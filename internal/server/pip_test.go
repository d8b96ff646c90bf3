package server_test

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// Debian's python3 and pip on the host, as the base template installs
// them (python3, python3-pip): the stand-in template below copies them.
const (
	hostPython = "/usr/bin/python3.11"
	hostStdlib = "/usr/lib/python3.11"
	hostPip    = "/usr/lib/python3/dist-packages/pip"
)

// TestPipInstallsAsUser: in a template with Debian's python3 and pip (the
// standard library's PEP 668 mark included, as in base), the default
// user's `pip install` of a local wheel works without flags, into
// ~/.local, as in E2B's default template. Debian's debootstrap takes
// minutes, so the template is busybox plus the host's Debian python3 and
// pip, built from an upload; the build step that makes pip work is the
// same for every template.
func TestPipInstallsAsUser(t *testing.T) {
	e := sharedServer(t)
	for _, p := range []string{hostPython, filepath.Join(hostStdlib, "EXTERNALLY-MANAGED"), hostPip} {
		if _, err := os.Stat(p); err != nil {
			if testenv.Required() {
				t.Fatalf("needs Debian's python3 and python3-pip on the host (make setup installs them): %v", err)
			}
			t.Skipf("needs Debian's python3 and python3-pip on the host: %v", err)
		}
	}
	ctx := context.Background()
	const name = "debian-pip"
	if _, err := e.client.UploadTemplate(ctx, name, bytes.NewReader(pipRootfs(t)), func(client.BuildProgress) {}); err != nil {
		t.Fatalf("build the pip template: %v", err)
	}
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), name) })
	sb := e.create(t, client.CreateRequest{TemplateID: name})
	const wheel = "/tmp/hello_agentenv-1.0-py3-none-any.whl"
	if err := e.client.WriteFile(ctx, sb, wheel, bytes.NewReader(testWheel(t))); err != nil {
		t.Fatal(err)
	}
	res := e.sh(t, sb, "id -un; python3 -m pip install --no-index --no-cache-dir "+wheel+" 2>&1")
	if res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "user\n") {
		t.Fatalf("pip install as the default user: exit %d, output:\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
	}
	res = e.sh(t, sb, "python3 -c 'import hello_agentenv as h; print(h.__file__, h.ANSWER)'")
	want := "/home/user/.local/lib/python3.11/site-packages/hello_agentenv.py 42\n"
	if res.ExitCode != 0 || string(res.Stdout) != want {
		t.Errorf("import after pip install: exit %d, got %q (stderr %q), want %q", res.ExitCode, res.Stdout, res.Stderr, want)
	}
}

// pipRootfs is a tar of busybox, the host's python3.11 with the shared
// libraries it and its extension modules load, its standard library
// (without tests and bytecode) and Debian's pip.
func pipRootfs(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	var mkdir func(d string)
	mkdir = func(d string) {
		if d == "." || d == "/" || dirs[d] {
			return
		}
		mkdir(filepath.Dir(d))
		dirs[d] = true
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: mode}); err != nil {
			t.Fatal(err)
		}
	}
	file := func(src, dst string) {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(src)
		if err != nil {
			t.Fatal(err)
		}
		mkdir(filepath.Dir(dst))
		if err := tw.WriteHeader(&tar.Header{Name: dst, Typeflag: tar.TypeReg, Mode: int64(st.Mode().Perm()), Size: int64(len(b)), ModTime: st.ModTime()}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	link := func(dst, target string) {
		mkdir(filepath.Dir(dst))
		if err := tw.WriteHeader(&tar.Header{Name: dst, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "tmp", "home/user", "root"} {
		mkdir(d)
	}
	file("/bin/busybox", "bin/busybox")
	for _, a := range []string{"sh", "id", "cat", "ls", "grep", "mkdir", "rm", "env"} {
		link("bin/"+a, "busybox")
	}
	file(hostPython, "usr/bin/python3.11")
	link("usr/bin/python3", "python3.11")
	binaries := []string{hostPython}
	skip := map[string]bool{"test": true, "idlelib": true, "tkinter": true, "turtledemo": true, "lib2to3": true,
		"ensurepip": true, "pydoc_data": true, "__pycache__": true, "site-packages": true, "dist-packages": true}
	for _, tree := range []string{hostStdlib, hostPip} {
		err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (skip[d.Name()] || strings.HasPrefix(d.Name(), "config-3")) {
				return filepath.SkipDir
			}
			if d.Type().IsRegular() {
				file(p, strings.TrimPrefix(p, "/"))
				if strings.HasSuffix(p, ".so") {
					binaries = append(binaries, p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	libs := map[string]bool{}
	for _, b := range binaries {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			continue // not dynamic
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			for i, w := range f {
				if strings.HasPrefix(w, "/") && (i == 0 || f[i-1] == "=>") {
					libs[w] = true
				}
			}
		}
	}
	for l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			t.Fatal(err)
		}
		file(real, strings.TrimPrefix(l, "/"))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testWheel is a pure-Python wheel of one module, hello_agentenv.
func testWheel(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	files := []struct{ name, body string }{
		{"hello_agentenv.py", "ANSWER = 42\n"},
		{"hello_agentenv-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hello-agentenv\nVersion: 1.0\n"},
		{"hello_agentenv-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: agentenv-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"hello_agentenv-1.0.dist-info/RECORD", "hello_agentenv.py,,\nhello_agentenv-1.0.dist-info/METADATA,,\nhello_agentenv-1.0.dist-info/WHEEL,,\nhello_agentenv-1.0.dist-info/RECORD,,\n"},
	}
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
