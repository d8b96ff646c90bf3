package template_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

var (
	envdOnce sync.Once
	envdBin  string
	envdDir  string // removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if envdDir != "" {
		os.RemoveAll(envdDir)
	}
	os.Exit(code)
}

// builtEnvd builds envd once for all tests of the package.
func builtEnvd(t *testing.T) string {
	t.Helper()
	envdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agentenv-template-test-")
		if err != nil {
			t.Fatal(err)
		}
		envdDir = dir
		envdBin = testenv.BuildEnvd(t, dir)
	})
	if envdBin == "" {
		t.Fatal("envd build failed in an earlier test")
	}
	return envdBin
}

// newStore opens a store in a temporary directory with a freshly built envd.
func newStore(t *testing.T) (*template.Store, string, string) {
	t.Helper()
	testenv.NeedRoot(t) // builds chown files to the sandbox user
	testenv.NeedCommand(t, "mkfs.erofs", "writes template images (package erofs-utils)")
	envdBin := builtEnvd(t)
	dir := t.TempDir()
	s, err := template.Open(dir, envdBin, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s, dir, envdBin
}

func noProgress(template.Progress) {}

// noStaging checks a build left no staging directory behind.
func noStaging(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".build-") || strings.HasPrefix(e.Name(), ".old-") {
			t.Errorf("build left %s behind", e.Name())
		}
	}
}

func fileContains(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	if !strings.Contains(string(b), want) {
		t.Errorf("%s = %q, want it to contain %q", path, b, want)
	}
}

func TestBuildBusybox(t *testing.T) {
	s, dir, envdBin := newStore(t)
	testenv.NeedCommand(t, "busybox", "the busybox template copies the host's busybox-static")
	var phases []string
	tpl, err := s.Build(context.Background(), template.BuildRequest{Name: "busybox", Busybox: true}, func(p template.Progress) {
		phases = append(phases, p.Phase)
	})
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if len(phases) == 0 || phases[len(phases)-1] != "done" {
		t.Errorf("got progress phases %q, want them to end with done", phases)
	}
	noStaging(t, dir)

	img := s.ImagePath("busybox")
	st, err := os.Stat(img)
	if err != nil {
		t.Fatalf("image: %v", err)
	}
	if img != filepath.Join(dir, "busybox", "image.erofs") || st.Size() == 0 || st.Size() != tpl.ImageSize {
		t.Errorf("got image %s of %d bytes (template says %d), want %s/busybox/image.erofs, non-empty", img, st.Size(), tpl.ImageSize, dir)
	}
	rootfs := filepath.Join(dir, "busybox", "rootfs")
	fileContains(t, filepath.Join(rootfs, "bin", "bash"), "exec /bin/sh")
	if st, err := os.Stat(filepath.Join(rootfs, "bin", "bash")); err != nil || st.Mode()&0o111 == 0 {
		t.Errorf("/bin/bash is not executable: %v %v", st, err)
	}
	fileContains(t, filepath.Join(rootfs, "etc", "passwd"), "user:x:1000:1000:user:/home/user:/bin/bash\n")
	fileContains(t, filepath.Join(rootfs, "etc", "group"), "user:x:1000:")
	if st, err := os.Stat(filepath.Join(rootfs, "home", "user")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("/home/user is not owned by uid 1000: %v", err)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode: got %v (%v), want sticky and world-writable", st.Mode(), err)
	}
	want, _ := os.ReadFile(envdBin)
	if got, err := os.ReadFile(filepath.Join(rootfs, template.EnvdPath)); err != nil || string(got) != string(want) {
		t.Errorf("envd at %s is not the built binary (err %v)", template.EnvdPath, err)
	}

	// In use: no delete, no rebuild; release (twice) then delete.
	path, release, err := s.Acquire("busybox")
	if err != nil || path != img {
		t.Fatalf("Acquire: got %q, %v, want %q", path, err, img)
	}
	if got, _ := s.Get("busybox"); got.InUse != 1 {
		t.Errorf("got InUse %d, want 1", got.InUse)
	}
	err = s.Delete("busybox")
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Delete while in use: got %v, want ErrConflict", err)
	}
	if status, _ := errdefs.HTTPStatus(err); status != http.StatusConflict {
		t.Errorf("Delete while in use: got HTTP %d, want 409", status)
	}
	if _, err := s.Build(context.Background(), template.BuildRequest{Name: "busybox", Busybox: true}, noProgress); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("rebuild while in use: got %v, want ErrConflict", err)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("image gone while in use: %v", err)
	}
	release()
	release() // safe to call twice: must not drop another user's reference
	if got, _ := s.Get("busybox"); got.InUse != 0 {
		t.Errorf("after release: got InUse %d, want 0", got.InUse)
	}

	// A reopened store finds the template.
	s2, err := template.Open(dir, envdBin, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if got, err := s2.Get("busybox"); err != nil || got.EnvdHash != tpl.EnvdHash {
		t.Errorf("reopened store: got %+v, %v, want the built template", got, err)
	}

	if err := s.Delete("busybox"); err != nil {
		t.Fatalf("Delete after release: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "busybox")); !os.IsNotExist(err) {
		t.Errorf("template directory still exists after Delete: %v", err)
	}
	if _, err := s.Get("busybox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete: got %v, want ErrNotFound", err)
	}
	if err := s.Delete("busybox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete: got %v, want ErrNotFound", err)
	}
	if _, _, err := s.Acquire("busybox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Acquire after Delete: got %v, want ErrNotFound", err)
	}
}

type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func writeTar(t *testing.T, path string, entries []tarEntry) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	writeTarTo(t, f, entries)
}

func tarBytes(t *testing.T, entries []tarEntry) *bytes.Reader {
	t.Helper()
	var b bytes.Buffer
	writeTarTo(t, &b, entries)
	return bytes.NewReader(b.Bytes())
}

func writeTarTo(t *testing.T, w io.Writer, entries []tarEntry) {
	t.Helper()
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body)), Linkname: e.link, Uid: e.uid, Gid: e.uid}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildFromTarball(t *testing.T) {
	s, dir, _ := newStore(t)
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	writeTar(t, tarball, []tarEntry{
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		// No trailing newline: the user line must still land on its own line.
		{name: "etc/passwd", typ: tar.TypeReg, mode: 0o644, body: "root:x:0:0:root:/root:/bin/sh"},
		{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "bin/hello", typ: tar.TypeReg, mode: 0o755, body: "#!/bin/sh\necho hi\n"},
		{name: "bin/sh", typ: tar.TypeSymlink, link: "hello"},
		{name: "srv/", typ: tar.TypeDir, mode: 0o755},
		{name: "srv/owned", typ: tar.TypeReg, mode: 0o600, body: "x", uid: 4242},
	})
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tpl, err := s.Build(context.Background(), template.BuildRequest{Name: "fromtar", Upload: f}, noProgress)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if tpl.Source != "upload" {
		t.Errorf("got source %q, want upload", tpl.Source)
	}
	rootfs := filepath.Join(dir, "fromtar", "rootfs")
	fileContains(t, filepath.Join(rootfs, "bin", "hello"), "echo hi")
	if l, err := os.Readlink(filepath.Join(rootfs, "bin", "sh")); err != nil || l != "hello" {
		t.Errorf("bin/sh: got link %q (%v), want hello", l, err)
	}
	if st, err := os.Stat(filepath.Join(rootfs, "srv", "owned")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 4242 {
		t.Errorf("srv/owned: numeric owner not kept: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/bash\n"; got != want {
		t.Errorf("got /etc/passwd %q, want %q", got, want)
	}
	fileContains(t, filepath.Join(rootfs, "bin", "bash"), "exec /bin/sh")
	if _, err := os.Stat(s.ImagePath("fromtar")); err != nil {
		t.Errorf("image: %v", err)
	}
	noStaging(t, dir)
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	s, dir, _ := newStore(t)
	_, err := s.Build(context.Background(), template.BuildRequest{Name: "broken", Upload: strings.NewReader("this is not a tarball")}, noProgress)
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Build from a broken tarball: got %v, want ErrInvalid", err)
	}
	if _, err := s.Get("broken"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after a failed build: got %v, want ErrNotFound", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		t.Errorf("failed build left %s behind", e.Name())
	}
}

// After an envd upgrade, RefreshEnvd bakes the new envd into existing
// templates, and the store reports the new envd at once (not only after a
// restart): EnsureBusybox, run right after it at start, must then find
// nothing to rebuild.
func TestRefreshEnvd(t *testing.T) {
	s, dir, oldEnvd := newStore(t)
	testenv.NeedCommand(t, "busybox", "the busybox template copies the host's busybox-static")
	ctx := context.Background()
	before, err := s.Build(ctx, template.BuildRequest{Name: "busybox", Busybox: true}, noProgress)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}

	// A "new" envd: the same binary with trailing bytes, so its hash differs.
	b, err := os.ReadFile(oldEnvd)
	if err != nil {
		t.Fatal(err)
	}
	newEnvd := filepath.Join(t.TempDir(), "envd")
	if err := os.WriteFile(newEnvd, append(b, "upgrade"...), 0o755); err != nil {
		t.Fatal(err)
	}
	s2, err := template.Open(dir, newEnvd, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.RefreshEnvd(ctx); err != nil {
		t.Fatalf("RefreshEnvd: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "busybox", "rootfs", template.EnvdPath))
	if err != nil || string(got) != string(b)+"upgrade" {
		t.Fatalf("envd in the refreshed rootfs is not the new binary (err %v)", err)
	}
	reopened, err := template.Open(dir, newEnvd, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := reopened.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if onDisk.EnvdHash == before.EnvdHash {
		t.Fatalf("template.json still records the old envd %s", before.EnvdHash)
	}
	inMemory, err := s2.Get("busybox")
	if err != nil {
		t.Fatal(err)
	}
	if inMemory.EnvdHash != onDisk.EnvdHash || inMemory.ImageSize != onDisk.ImageSize {
		t.Errorf("after RefreshEnvd the store reports envd %s (image %d bytes), want %s (%d bytes) as written to template.json",
			inMemory.EnvdHash, inMemory.ImageSize, onDisk.EnvdHash, onDisk.ImageSize)
	}
	st, _ := os.Stat(filepath.Join(dir, "busybox", "image.erofs"))
	if err := s2.EnsureBusybox(ctx); err != nil {
		t.Fatalf("EnsureBusybox: %v", err)
	}
	if st2, _ := os.Stat(filepath.Join(dir, "busybox", "image.erofs")); st == nil || st2 == nil || !os.SameFile(st, st2) {
		t.Errorf("EnsureBusybox rebuilt the busybox template that RefreshEnvd had just updated")
	}
}

// TestBusyboxImageIsReproducible: every fleet node builds busybox itself;
// snapshots restore only onto the same image bytes.
func TestBusyboxImageIsReproducible(t *testing.T) {
	testenv.NeedCommand(t, "busybox", "the busybox template copies the host's busybox-static")
	var sums []string
	for range 2 {
		s, dir, _ := newStore(t)
		if _, err := s.Build(context.Background(), template.BuildRequest{Name: "busybox", Busybox: true}, noProgress); err != nil {
			t.Fatalf("Build: %v", err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "busybox", "image.erofs"))
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, fmt.Sprintf("%x", sha256.Sum256(b)))
	}
	if sums[0] != sums[1] {
		t.Fatalf("two busybox builds: images %s and %s, want the same bytes", sums[0], sums[1])
	}
}

// A template is its builder's: another key's rebuild is refused before
// anything is written, the operator's keeps the owner, and the owner
// survives a reopened store.
func TestBuildOwner(t *testing.T) {
	s, dir, envdBin := newStore(t)
	testenv.NeedCommand(t, "busybox", "the busybox template copies the host's busybox-static")
	ctx := context.Background()
	build := func(owner string) (template.Template, error) {
		return s.Build(ctx, template.BuildRequest{Name: "alice-py", Busybox: true, Owner: owner}, noProgress)
	}
	first, err := build("alice")
	if err != nil || first.Owner != "alice" {
		t.Fatalf("alice's build: owner %q, %v; want alice", first.Owner, err)
	}
	if _, err := build("bob"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("bob rebuilds alice's template: got %v, want permission denied", err)
	}
	if got, _ := s.Get("alice-py"); !got.CreatedAt.Equal(first.CreatedAt) || got.Owner != "alice" {
		t.Errorf("after bob's attempt: %+v, want alice's first build untouched", got)
	}
	if got, err := build(""); err != nil || got.Owner != "alice" {
		t.Errorf("the operator's rebuild: owner %q, %v; want it kept alice's", got.Owner, err)
	}
	if _, err := build("alice"); err != nil {
		t.Errorf("alice rebuilds her own: %v", err)
	}
	noStaging(t, dir)
	s2, err := template.Open(dir, envdBin, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := s2.Get("alice-py"); got.Owner != "alice" {
		t.Errorf("reopened store: owner %q, want alice", got.Owner)
	}
}
