package runtimetest

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// layers checks a sandbox on a stack of images (Spec.Lowers): it sees
// the files of every layer, the highest copy of a path wins, its writes
// stay in its write layer (the images are unchanged), and a checkpoint
// restores onto the same stack, twice (a fork), the children apart. A runtime that does not stack refuses the
// spec (ErrInvalid).
func layers(t *testing.T, env Env, r runtime.Runtime) {
	ctx := context.Background()
	top := thinImage(t, env, map[string]string{"layer/file": "from the top\n", "etc/hostname": "top\n"})
	s := spec(t, env)
	s.Image, s.Lowers, s.DiskMB = top, []string{env.Image}, 64
	if ls, ok := r.(runtime.LayerStacker); !ok || !ls.StacksLayers() {
		if err := r.Create(ctx, s); !errors.Is(err, errdefs.ErrInvalid) {
			r.Destroy(ctx, s.ID)
			t.Errorf("create on a stack with a runtime that does not stack: %v, want ErrInvalid", err)
		}
		t.Skip("runtime does not stack layers (a LayerStacker saying yes)")
	}
	before := imageBytes(t, top, env.Image)
	if err := r.Create(ctx, s); err != nil {
		t.Fatalf("create on a stack of 2 images: %v", err)
	}
	t.Cleanup(func() { r.Destroy(ctx, s.ID) })
	if got := exec(t, r, s.ID, "cat /layer/file /etc/hostname; [ -x /bin/sh ] && echo base"); got != "from the top\ntop\nbase\n" {
		t.Errorf("sandbox on a stack reads %q, want the top layer's files over the base's", got)
	}
	exec(t, r, s.ID, "echo written > /layer/new; echo changed > /layer/file")
	if got := imageBytes(t, top, env.Image); got != before {
		t.Errorf("the images changed under a sandbox's writes")
	}
	cp, ok := r.(runtime.Checkpointer)
	if !ok {
		return
	}
	img := filepath.Join(env.Dir, s.ID+"-ckpt")
	if err := cp.Checkpoint(ctx, s.ID, img); err != nil {
		t.Fatalf("checkpoint: %v", err)
	}
	// Two children of one checkpoint (a fork): each continues from it,
	// and neither sees the other's writes.
	var kids []runtime.Spec
	for i := range 2 {
		c := spec(t, env)
		c.Image, c.Lowers, c.DiskMB = s.Image, s.Lowers, s.DiskMB
		if err := cp.Restore(ctx, c, img); err != nil {
			t.Fatalf("restore %d onto the stack: %v", i, err)
		}
		t.Cleanup(func() { r.Destroy(ctx, c.ID) })
		kids = append(kids, c)
	}
	exec(t, r, kids[0].ID, "echo first child > /layer/file")
	if got := exec(t, r, kids[1].ID, "cat /layer/new /layer/file /etc/hostname"); got != "written\nchanged\ntop\n" {
		t.Errorf("restored sandbox reads %q, want its writes over the stack (and not its sibling's)", got)
	}
	// A sandbox on the same stack does not see another's writes.
	o := spec(t, env)
	o.Image, o.Lowers, o.DiskMB = s.Image, s.Lowers, s.DiskMB
	if err := r.Create(ctx, o); err != nil {
		t.Fatalf("create a second sandbox on the stack: %v", err)
	}
	t.Cleanup(func() { r.Destroy(ctx, o.ID) })
	if got := exec(t, r, o.ID, "cat /layer/file; [ -e /layer/new ] && echo leaked || true"); got != "from the top\n" {
		t.Errorf("a second sandbox on the stack reads %q, want the top layer as built", got)
	}
}

// thinImage makes an EROFS image of files (path -> content).
func thinImage(t *testing.T, env Env, files map[string]string) string {
	t.Helper()
	if _, err := osexec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("mkfs.erofs not found (package erofs-utils)")
	}
	dir := t.TempDir()
	for p, content := range files {
		dst := filepath.Join(dir, "root", p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	image := filepath.Join(dir, "layer.erofs")
	// gVisor cannot map tail-packed data.
	if out, err := osexec.Command("mkfs.erofs", "-E", "noinline_data", image, filepath.Join(dir, "root")).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v\n%s", err, out)
	}
	return image
}

// imageBytes is the content of the images, to see that nothing wrote them.
func imageBytes(t *testing.T, images ...string) string {
	t.Helper()
	var all []byte
	for _, p := range images {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return string(all)
}

// layersXattrs checks a stack of three whose middle image was made, as
// thin templates' images are, without the extended attributes its tree
// has (mkfs.erofs -x -1): gVisor's EROFS refuses to open a file that has
// any (EOPNOTSUPP), in whatever layer. The sandbox reads every layer.
func layersXattrs(t *testing.T, env Env, r runtime.Runtime) {
	ctx := context.Background()
	if ls, ok := r.(runtime.LayerStacker); !ok || !ls.StacksLayers() {
		t.Skip("runtime does not stack layers (a LayerStacker saying yes)")
	}
	if _, err := osexec.LookPath("mkfs.erofs"); err != nil {
		t.Skip("mkfs.erofs not found (package erofs-utils)")
	}
	dir := t.TempDir()
	mid := filepath.Join(dir, "mid")
	if err := os.MkdirAll(filepath.Join(mid, "mid"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(mid, "mid", "file")
	if err := os.WriteFile(f, []byte("from the middle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, x := range []string{"user.agentenv", "trusted.agentenv"} {
		if err := unixSetxattr(f, x, "1"); err != nil {
			t.Skipf("set xattr %s: %v", x, err)
		}
	}
	image := func(name, tree string) string {
		p := filepath.Join(dir, name+".erofs")
		if out, err := osexec.Command("mkfs.erofs", "-x", "-1", "-E", "noinline_data", p, tree).CombinedOutput(); err != nil {
			t.Fatalf("mkfs.erofs: %v\n%s", err, out)
		}
		return p
	}
	midImage := image("mid", mid)
	topTree := filepath.Join(dir, "top")
	os.MkdirAll(filepath.Join(topTree, "layer"), 0o755)
	os.WriteFile(filepath.Join(topTree, "layer", "file"), []byte("from the top\n"), 0o644)
	top := image("top", topTree)
	s := spec(t, env)
	s.Image, s.Lowers, s.DiskMB = top, []string{midImage, env.Image}, 64
	if err := r.Create(ctx, s); err != nil {
		t.Fatalf("create on a stack of 3 images: %v", err)
	}
	t.Cleanup(func() { r.Destroy(ctx, s.ID) })
	if got := exec(t, r, s.ID, "cat /layer/file /mid/file; [ -x /bin/sh ] && echo base"); got != "from the top\nfrom the middle\nbase\n" {
		t.Errorf("sandbox on the stack reads %q, want every layer's files", got)
	}
}
