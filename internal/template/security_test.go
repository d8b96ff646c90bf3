package template_test

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// hostState records everything a build could change under dir: names,
// types, modes, owners and contents.
func hostState(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			lines = append(lines, p+" error "+err.Error())
			return nil
		}
		st, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		sys := st.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %v %d:%d", p, st.Mode(), sys.Uid, sys.Gid)
		if st.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		lines = append(lines, line)
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestUploadCannotReachHost: a client's rootfs tarball with symlinks,
// absolute names, ".." and hard links out must not read, write, chown or
// chmod anything on the host (an earlier build
// chowned, chmodded 1777 and appended to symlink targets).
func TestUploadCannotReachHost(t *testing.T) {
	s, dir, _ := newStore(t)
	victim := t.TempDir()
	os.WriteFile(filepath.Join(victim, "hosts"), []byte("10.0.0.1 victim\n"), 0o600)
	os.WriteFile(filepath.Join(victim, "passwd"), []byte("victim:x:0:0::/:/bin/sh\n"), 0o600)
	os.Mkdir(filepath.Join(victim, "home"), 0o700)
	os.Chmod(victim, 0o700)
	before := hostState(t, victim)

	dirE := func(n string) tarEntry { return tarEntry{name: n, typ: tar.TypeDir, mode: 0o755} }
	tests := []struct {
		name    string
		entries []tarEntry
		// refused: the upload must fail (otherwise it may build, harmlessly).
		refused bool
	}{
		{"home/user symlink to host dir", []tarEntry{dirE("home/"), {name: "home/user", typ: tar.TypeSymlink, link: filepath.Join(victim, "home")}}, false},
		{"tmp symlink to host dir", []tarEntry{{name: "tmp", typ: tar.TypeSymlink, link: victim}}, false},
		{"etc/hosts symlink to host file", []tarEntry{dirE("etc/"), {name: "etc/hosts", typ: tar.TypeSymlink, link: filepath.Join(victim, "hosts")}}, false},
		{"etc/resolv.conf symlink to host file", []tarEntry{dirE("etc/"), {name: "etc/resolv.conf", typ: tar.TypeSymlink, link: filepath.Join(victim, "hosts")}}, false},
		{"etc/passwd symlink relative out", []tarEntry{dirE("etc/"), {name: "etc/passwd", typ: tar.TypeSymlink, link: "../../../../../../../../" + filepath.Join(victim, "passwd")}}, false},
		{"etc symlink to host dir", []tarEntry{{name: "etc", typ: tar.TypeSymlink, link: victim}}, false},
		{"envd dir symlink to host dir", []tarEntry{{name: ".agentenv", typ: tar.TypeSymlink, link: victim}}, false},
		{"write through a symlinked dir", []tarEntry{{name: "out", typ: tar.TypeSymlink, link: victim}, {name: "out/planted", typ: tar.TypeReg, mode: 0o644, body: "x"}}, true},
		{"absolute entry name", []tarEntry{{name: filepath.Join(victim, "planted"), typ: tar.TypeReg, mode: 0o644, body: "x"}}, true},
		{"dot-dot entry name", []tarEntry{{name: "a/../../../../../../../../" + victim + "/planted", typ: tar.TypeReg, mode: 0o644, body: "x"}}, true},
		{"hard link to host file", []tarEntry{{name: "stolen", typ: tar.TypeLink, link: filepath.Join(victim, "passwd")}}, true},
		{"hard link dot-dot", []tarEntry{{name: "stolen", typ: tar.TypeLink, link: "../../../../../../" + filepath.Join(victim, "passwd")}}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := fmt.Sprintf("evil%d", i)
			_, err := s.Build(context.Background(), template.BuildRequest{Name: name, Upload: tarBytes(t, tt.entries)}, noProgress)
			if tt.refused && err == nil {
				t.Errorf("build succeeded, want it refused")
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) && !strings.Contains(err.Error(), "escapes") {
				t.Logf("build error (not ErrInvalid): %v", err)
			}
			if after := hostState(t, victim); after != before {
				t.Fatalf("host files changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if err == nil {
				// What was built holds links, not host content (envd,
				// here the test binary, holds the word itself).
				rootfs := filepath.Join(dir, name, "rootfs")
				filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
					if err == nil && d.Type().IsRegular() && p != filepath.Join(rootfs, template.EnvdPath) {
						if b, _ := os.ReadFile(p); strings.Contains(string(b), "victim") {
							t.Errorf("%s holds host content", p)
						}
					}
					return nil
				})
				s.Delete(name)
			}
		})
	}
	noStaging(t, dir)
}

// TestUploadSkipsDevices: device nodes in an upload are not created.
func TestUploadSkipsDevices(t *testing.T) {
	s, dir, _ := newStore(t)
	var msgs []string
	_, err := s.Build(context.Background(), template.BuildRequest{Name: "devs", Upload: tarBytes(t, []tarEntry{
		{name: "dev/", typ: tar.TypeDir, mode: 0o755},
		{name: "dev/sda", typ: tar.TypeBlock, mode: 0o666},
		{name: "dev/mem", typ: tar.TypeChar, mode: 0o666},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/suid", typ: tar.TypeReg, mode: 0o4755, body: "x"},
	})}, func(p template.Progress) { msgs = append(msgs, p.Message) })
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"dev/sda", "dev/mem"} {
		if _, err := os.Lstat(filepath.Join(dir, "devs", "rootfs", n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: got %v, want it not created", n, err)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "devs", "rootfs", "bin/suid")); err != nil || st.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("bin/suid: got %v (%v), want the setuid bit kept", st.Mode(), err)
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "skipped 2") {
		t.Errorf("progress %q: want a note that 2 entries were skipped", msgs)
	}
}

// TestImportDirOnly: host paths are read only from the operator's import
// directory; a symlink inside it that points out is imported as a link,
// never as the host file's content.
func TestImportDirOnly(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "mkfs.erofs", "writes template images (package erofs-utils)")
	dir := t.TempDir()
	imports := filepath.Join(dir, "imports")
	tree := filepath.Join(imports, "tree")
	os.MkdirAll(filepath.Join(tree, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("host secret"), 0o600)
	os.Symlink(filepath.Join(dir, "secret"), filepath.Join(tree, "etc", "secret"))
	os.WriteFile(filepath.Join(tree, "hello"), []byte("hello"), 0o644)
	s, err := template.OpenWithOptions(filepath.Join(dir, "templates"), builtEnvd(t), template.Options{ImportDir: imports}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Build(context.Background(), template.BuildRequest{Name: "imp", Rootfs: "tree"}, noProgress); err != nil {
		t.Fatalf("import from the import dir: %v", err)
	}
	rootfs := filepath.Join(dir, "templates", "imp", "rootfs")
	fileContains(t, filepath.Join(rootfs, "hello"), "hello")
	if st, err := os.Lstat(filepath.Join(rootfs, "etc", "secret")); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("etc/secret: got %v (%v), want a symlink", st, err)
	}
	for _, p := range []string{dir, "/etc", "../secret", "/proc/self/root/etc"} {
		if _, err := s.Build(context.Background(), template.BuildRequest{Name: "out", Rootfs: p}, noProgress); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("import %q: got %v, want ErrInvalid", p, err)
		}
	}
	if _, err := s.Get("out"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a refused import left a template: %v", err)
	}
}

// TestBuildKeepsOtherTemplates: building X must not touch template X.old
// (an earlier build removed "<name>.old" as its scratch directory).
func TestBuildKeepsOtherTemplates(t *testing.T) {
	s, dir, _ := newStore(t)
	ctx := context.Background()
	for _, n := range []string{"a.old", "a", "a"} {
		if _, err := s.Build(ctx, template.BuildRequest{Name: n, Busybox: true}, noProgress); err != nil {
			t.Fatalf("build %s: %v", n, err)
		}
	}
	if _, err := s.Get("a.old"); err != nil {
		t.Fatalf("a.old after building a twice: %v", err)
	}
	if _, err := os.Stat(s.ImagePath("a.old")); err != nil {
		t.Errorf("a.old's image: %v", err)
	}
	noStaging(t, dir)
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("templates dir mode: got %v (%v), want 0700", st.Mode().Perm(), err)
	}
}

// TestDebootstrapRefusesUnsignedMirror: an operator mirror without a valid
// signature fails the build before any package is fetched or run (finding
// 1: debootstrap went on unsigned and ran a package's script as host root).
func TestDebootstrapRefusesUnsignedMirror(t *testing.T) {
	testenv.NeedCommand(t, "debootstrap", "builds Debian templates (package debootstrap)")
	s0, _, envd := newStore(t)
	_ = s0
	var mu sync.Mutex
	var requested []string
	repo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requested = append(requested, r.URL.Path)
		mu.Unlock()
		switch {
		case strings.HasSuffix(r.URL.Path, "/dists/jammy/Release"), strings.HasSuffix(r.URL.Path, "/dists/bookworm/Release"):
			fmt.Fprint(w, "Origin: evil\nSuite: bookworm\nCodename: bookworm\nArchitectures: amd64\nComponents: main\nSHA256:\n")
		default:
			http.NotFound(w, r)
		}
	}))
	defer repo.Close()
	dir := t.TempDir()
	s, err := template.OpenWithOptions(filepath.Join(dir, "templates"), envd, template.Options{DebianMirror: repo.URL + "/evil"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, suite := range []string{"bookworm", "jammy"} {
		_, err := s.Build(context.Background(), template.BuildRequest{Name: "deb-" + suite, Debian: suite}, noProgress)
		if err == nil {
			t.Fatalf("%s from an unsigned mirror: build succeeded", suite)
		}
		if !strings.Contains(err.Error(), "signature") && !strings.Contains(err.Error(), "Release") {
			t.Errorf("%s: got %v, want a signature error", suite, err)
		}
		if testing.Verbose() {
			t.Logf("%s: %v", suite, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range requested {
		if strings.HasSuffix(p, ".deb") || strings.Contains(p, "Packages") {
			t.Errorf("fetched %s from an unsigned mirror", p)
		}
	}
	if len(requested) == 0 {
		t.Errorf("debootstrap never asked the mirror: the test proves nothing")
	}
}
