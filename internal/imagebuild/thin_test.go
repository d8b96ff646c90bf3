package imagebuild_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// thinFixedCost bounds what a thin template takes beyond its own files:
// its image's superblock, root directory and inodes, template.json.
const thinFixedCost = 64 << 10

// thinEnv is an env whose builder writes thin layers, with a GNU base
// template "gnu" (an upload, so flat).
func thinEnv(t *testing.T) *env {
	e := newEnv(t, false)
	e.cfg.ThinLayers = true
	b, err := imagebuild.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	root := t.TempDir()
	testenv.GNURootfs(t, root)
	os.MkdirAll(filepath.Join(root, "etc/default"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/default/x"), []byte("x\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/gone"), []byte("gone\n"), 0o644)
	var tarball bytes.Buffer
	if err := template.WriteTar(context.Background(), &tarball, root); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Build(context.Background(), template.BuildRequest{Name: "gnu", Upload: &tarball}, func(template.Progress) {}); err != nil {
		t.Fatal(err)
	}
	return e
}

// build runs spec and stores its template.
func (e *env) build(spec imagebuild.Spec) (template.Template, []string) {
	e.t.Helper()
	var lines []string
	req, cleanup, err := e.b.Prepare(context.Background(), spec, func(l imagebuild.LogEntry) { lines = append(lines, l.Message) })
	if err != nil {
		e.t.Fatalf("Prepare %s: %v\n%s", spec.Name, err, strings.Join(lines, "\n"))
	}
	// As the server does: the build's holds end once the store took it.
	defer cleanup()
	tpl, err := e.store.Build(context.Background(), req, func(template.Progress) {})
	if err != nil {
		e.t.Fatalf("store.Build %s: %v", spec.Name, err)
	}
	return tpl, lines
}

func randomFile(t *testing.T, size int) string {
	b := make([]byte, size)
	rand.Read(b)
	return string(b)
}

// copyOne is a build of name on base copying one file of body to /task/f.
func copyOne(t *testing.T, name, base, body string) imagebuild.Spec {
	hash := "h-" + name
	files := map[string][]byte{hash: archive(t, map[string]string{"f": body})}
	return imagebuild.Spec{Name: name, FromTemplate: base, Files: filesFrom(files), Steps: []imagebuild.Step{
		{Type: "COPY", Args: []string{"f", "/task/f", "root", "0644"}, FilesHash: hash},
	}}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// Templates built on one base share its image: each stores only what its
// steps changed, a step that changes nothing stores about nothing, and
// twenty of them cost twenty times their files plus a small fixed cost.
func TestThinTemplates(t *testing.T) {
	e := thinEnv(t)
	base, _ := e.store.Get("gnu")
	before := e.store.DiskBytes()

	const size = 1 << 20
	start := time.Now()
	a, _ := e.build(copyOne(t, "a", "gnu", randomFile(t, size)))
	t.Logf("thin build of a 1 MiB COPY on the GNU base: %s, own %d KiB (base %d KiB)", time.Since(start).Round(time.Millisecond), a.OwnBytes>>10, base.OwnBytes>>10)
	if len(a.Lowers) != 1 || a.Lowers[0] == "" {
		t.Fatalf("a: lowers %v, want the base's image", a.Lowers)
	}
	if a.OwnBytes > size+thinFixedCost || a.OwnBytes < size {
		t.Errorf("a takes %d bytes of its own, want about its file's %d", a.OwnBytes, size)
	}
	// The base's image is the layer, not a copy of it.
	if inode(t, e.store.LayerPath(a.Lowers[0])) != inode(t, e.store.ImagePath("gnu")) {
		t.Errorf("the base's layer is not its image (a copy?)")
	}
	if a.SharedBytes < base.ImageSize {
		t.Errorf("a's shared bytes %d, want at least the base's image %d", a.SharedBytes, base.ImageSize)
	}
	b, _ := e.build(copyOne(t, "b", "gnu", randomFile(t, size)))
	if !slicesEqual(b.Lowers, a.Lowers) {
		t.Errorf("b's lowers %v, a's %v: want the same base layer", b.Lowers, a.Lowers)
	}
	if grew := e.store.DiskBytes() - before; grew > a.OwnBytes+b.OwnBytes+4096 {
		t.Errorf("two thin templates grew the store by %d bytes, want their own %d + %d", grew, a.OwnBytes, b.OwnBytes)
	}

	// A step that changes nothing new.
	noop, _ := e.build(imagebuild.Spec{Name: "noop", FromTemplate: "gnu", Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"true", "root"}},
	}})
	t.Logf("thin template of a step that changes nothing: %d bytes", noop.OwnBytes)
	if noop.OwnBytes > thinFixedCost {
		t.Errorf("a template whose step changed nothing takes %d bytes, want at most %d", noop.OwnBytes, thinFixedCost)
	}

	// A thin template on a thin one stacks both.
	c, _ := e.build(imagebuild.Spec{Name: "c", FromTemplate: "a", Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"cat /task/f | wc -c > /task/n", "root"}},
	}})
	if len(c.Lowers) != 2 || c.Lowers[1] != a.Lowers[0] || c.Lowers[0] != a.Digest {
		t.Errorf("c's lowers %v, want a's image %s over the base's %v", c.Lowers, a.Digest, a.Lowers)
	}

	// Twenty thin templates.
	mid := e.store.DiskBytes()
	var own int64
	for i := range 20 {
		tpl, _ := e.build(copyOne(t, fmt.Sprintf("task-%d", i), "gnu", randomFile(t, 64<<10)))
		own += tpl.OwnBytes
	}
	grew := e.store.DiskBytes() - mid
	per := (grew - 20*(64<<10)) / 20
	t.Logf("20 thin templates of a 64 KiB file: %d KiB in all, %d KiB fixed cost each", grew>>10, per>>10)
	if grew > 20*(64<<10+thinFixedCost) {
		t.Errorf("20 thin templates of 64 KiB each took %d bytes, want at most %d", grew, 20*(64<<10+thinFixedCost))
	}

	// A builder whose runtime stacks no layers builds flat, on a thin
	// template too (its stack mounted, the merged root copied).
	flatCfg := e.cfg
	flatCfg.ThinLayers = false
	fb, err := imagebuild.New(flatCfg)
	if err != nil {
		t.Fatal(err)
	}
	thinB := e.b
	e.b = fb
	flat, lines := e.build(imagebuild.Spec{Name: "flat-on-a", FromTemplate: "a", Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"test -s /task/f && echo ok > /task/ok", "root"}},
	}})
	e.b = thinB
	if len(flat.Lowers) != 0 || flat.OwnBytes < size {
		t.Errorf("flat build on thin a: lowers %v, own %d bytes; want a whole root\n%s", flat.Lowers, flat.OwnBytes, strings.Join(lines, "\n"))
	}

	// Deleting every template on the base frees nothing of it; deleting
	// the base too removes its layer.
	for _, n := range []string{"c"} {
		if err := e.store.Delete(n); err != nil {
			t.Fatal(err)
		}
	}
	if e.store.HasLayer(a.Digest) {
		t.Errorf("a's layer outlived the only template on it")
	}
	if !e.store.HasLayer(a.Lowers[0]) {
		t.Errorf("the base's layer went while templates stack on it")
	}
	// A template whose base is gone still boots on the base's layer.
	if err := e.store.Delete("gnu"); err != nil {
		t.Fatal(err)
	}
	if !e.store.HasLayer(a.Lowers[0]) {
		t.Errorf("the base's layer went with the base, while templates stack on it")
	}
	st, release, err := e.store.AcquireStack("a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if len(st.LowerPaths) != 1 || st.LowerPaths[0] != e.store.LayerPath(a.Lowers[0]) {
		t.Errorf("a's stack: %+v", st)
	}
}

// What a thin layer cannot say makes the template flat: a step deleting
// a file of the base, or setting a file capability.
func TestThinFallsBackToFlat(t *testing.T) {
	e := thinEnv(t)
	for _, c := range []struct{ name, cmd string }{
		{"deletes", "rm /etc/gone && echo x > /x"},
		{"replaces-dir", "rm -rf /etc/default && mkdir /etc/default"},
	} {
		tpl, lines := e.build(imagebuild.Spec{Name: c.name, FromTemplate: "gnu", Steps: []imagebuild.Step{
			{Type: "RUN", Args: []string{c.cmd, "root"}},
		}})
		if len(tpl.Lowers) != 0 {
			t.Errorf("%s: a thin template (lowers %v) although its step deletes from the base", c.name, tpl.Lowers)
		}
		if !strings.Contains(strings.Join(lines, "\n"), "no thin layer") {
			t.Errorf("%s: the log does not say why the template is flat:\n%s", c.name, strings.Join(lines, "\n"))
		}
	}
	// Built again from the flat one: it is a base like any other.
	tpl, _ := e.build(copyOne(t, "on-flat", "deletes", "z"))
	if len(tpl.Lowers) != 1 {
		t.Errorf("on-flat: lowers %v", tpl.Lowers)
	}
}

func TestThinBlocker(t *testing.T) {
	testenv.NeedRoot(t) // whiteouts and trusted.* xattrs
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a/b"), 0o755)
	os.WriteFile(filepath.Join(dir, "a/b/f"), []byte("x"), 0o644)
	if why := template.ThinBlocker(dir); why != "" {
		t.Errorf("plain files: %q", why)
	}
	if err := syscall.Mknod(filepath.Join(dir, "a/gone"), syscall.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if why := template.ThinBlocker(dir); !strings.Contains(why, "deletes /a/gone") {
		t.Errorf("whiteout: %q", why)
	}
	os.Remove(filepath.Join(dir, "a/gone"))
	if err := syscall.Setxattr(filepath.Join(dir, "a/b"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if why := template.ThinBlocker(dir); !strings.Contains(why, "replaces the directory /a/b") {
		t.Errorf("opaque dir: %q", why)
	}
	syscall.Removexattr(filepath.Join(dir, "a/b"), "trusted.overlay.opaque")
	// security.capability v2 for cap_net_raw.
	capv2 := []byte{0, 0, 0, 2, 0, 0x20, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if err := syscall.Setxattr(filepath.Join(dir, "a/b/f"), "security.capability", capv2, 0); err != nil {
		t.Fatal(err)
	}
	if why := template.ThinBlocker(dir); !strings.Contains(why, "capabilities on /a/b/f") {
		t.Errorf("file capability: %q", why)
	}
}

func slicesEqual(a, b []string) bool {
	return strings.Join(a, ",") == strings.Join(b, ",")
}

// Templates from one pulled image share it as one layer (made once, with
// envd): each stores only its steps' files.
func TestThinFromImage(t *testing.T) {
	e := newEnv(t, true)
	e.cfg.ThinLayers = true
	b, err := imagebuild.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.b = b
	var lowers []string
	for i, name := range []string{"img-a", "img-b"} {
		spec := copyOne(t, name, "", fmt.Sprintf("task %d\n", i))
		spec.FromTemplate, spec.FromImage = "", e.ref
		tpl, lines := e.build(spec)
		if len(tpl.Lowers) != 1 {
			t.Fatalf("%s: lowers %v, want the image's layer\n%s", name, tpl.Lowers, strings.Join(lines, "\n"))
		}
		if lowers != nil && tpl.Lowers[0] != lowers[0] {
			t.Errorf("%s stacks on %s, the first template on %s: want one layer of the image", name, tpl.Lowers[0][:12], lowers[0][:12])
		}
		lowers = tpl.Lowers
		if tpl.OwnBytes > thinFixedCost {
			t.Errorf("%s takes %d bytes of its own (envd not in the image's layer?), want at most %d", name, tpl.OwnBytes, thinFixedCost)
		}
		st, release, err := e.store.AcquireStack(name, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		mnt := t.TempDir()
		if err := template.MountImage(st.LowerPaths[0], mnt); err != nil {
			t.Fatal(err)
		}
		_, envdErr := os.Stat(filepath.Join(mnt, strings.TrimPrefix(template.EnvdPath, "/")))
		template.Unmount(mnt)
		release()
		if envdErr != nil {
			t.Errorf("the image's layer has no envd: %v", envdErr)
		}
	}
}
