package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
	wire "github.com/agentenv/agentenv/client/api"
)

// TestLayeredTemplates: a template built on another stacks a thin layer
// on the base's image; its sandboxes see every layer, their writes stay
// their own, and snapshots, restores, forks and pauses without memory
// work on the stack. A restore whose layer is gone is a 404 naming it.
// On busybox and on a GNU userland.
func TestLayeredTemplates(t *testing.T) {
	e := sharedServer(t)
	for _, base := range []string{"busybox", gnuTemplate(t, e)} {
		t.Run(base, func(t *testing.T) { layeredOn(t, e, base) })
	}
}

func layeredOn(t *testing.T, e *env, base string) {
	ctx := context.Background()
	name := "layered-" + base
	var created wire.TemplateRequestResponseV3
	e.jsonCall(t, "POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name}, http.StatusAccepted, &created)
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), name) })
	e.jsonCall(t, "POST", "/v2/templates/"+name+"/builds/"+created.BuildID, wire.TemplateBuildStartV2{
		FromTemplate: base, Steps: []wire.TemplateStep{{Type: "RUN", Args: []string{"mkdir -p /task && echo from-layer > /task/mark && chmod 777 /task && chmod 666 /task/mark", "root"}}},
	}, http.StatusAccepted, nil)
	waitBuild(t, e, name, created.BuildID)

	tpl, err := e.client.GetTemplate(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	baseTpl, err := e.client.GetTemplate(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d layers, own %d bytes, shared %d bytes", name, tpl.Layers, tpl.OwnBytes, tpl.SharedBytes)
	if tpl.Layers != 2 || tpl.OwnBytes > 64<<10 || tpl.SharedBytes < baseTpl.ImageSize {
		t.Fatalf("template on %s: %d layers, own %d bytes, shared %d; want 2 layers, a few KiB of its own and the base's %d shared",
			base, tpl.Layers, tpl.OwnBytes, tpl.SharedBytes, baseTpl.ImageSize)
	}
	image := filepath.Join(e.dataDir, "templates", name, "image.erofs")
	sum := fileSum(t, image)

	sb := e.create(t, client.CreateRequest{TemplateID: name})
	// The base's files (sh is the base's), the layer's, and a write.
	if got := e.sh(t, sb, "cat /task/mark && echo mine > /task/mark && echo new > /task/new && cat /task/mark /task/new"); string(got.Stdout) != "from-layer\nmine\nnew\n" {
		t.Fatalf("sandbox on the stack: %q %s (exit %d)", got.Stdout, got.Stderr, got.ExitCode)
	}
	other := e.create(t, client.CreateRequest{TemplateID: name})
	if got := e.sh(t, other, "cat /task/mark; ls /task"); string(got.Stdout) != "from-layer\nmark\n" {
		t.Errorf("another sandbox of the template sees %q: a sandbox's writes leaked", got.Stdout)
	}
	if fileSum(t, image) != sum {
		t.Errorf("the template's layer changed under its sandboxes")
	}

	// Snapshot and restore, fork, pause without memory.
	sn, err := e.client.SnapshotSandbox(ctx, sb.SandboxID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.client.DeleteSnapshot(context.Background(), sn.SnapshotID) })
	restored := e.create(t, client.CreateRequest{TemplateID: sn.SnapshotID})
	if got := e.sh(t, restored, "cat /task/mark /task/new"); string(got.Stdout) != "mine\nnew\n" {
		t.Errorf("restored on the stack: %q %s", got.Stdout, got.Stderr)
	}
	for _, kid := range e.fork(t, e.client, sb.SandboxID, 2) {
		if got := e.sh(t, kid, "cat /task/mark"); string(got.Stdout) != "mine\n" {
			t.Errorf("fork child %s: %q %s", kid.SandboxID, got.Stdout, got.Stderr)
		}
	}
	if err := e.client.PauseSandboxFiles(ctx, other.SandboxID); err != nil {
		t.Fatalf("pause without memory: %v", err)
	}
	if _, err := e.client.ResumeSandbox(ctx, other.SandboxID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := e.sh(t, other, "cat /task/mark"); string(got.Stdout) != "from-layer\n" {
		t.Errorf("resumed after a pause without memory: %q %s", got.Stdout, got.Stderr)
	}
	for _, s := range []client.Sandbox{sb, other, restored} {
		e.client.KillSandbox(ctx, s.SandboxID)
	}

	// The base's layer gone (removed by hand): the restore says which.
	layers, _ := filepath.Glob(filepath.Join(e.dataDir, "templates", ".layers", "sha256-*.erofs"))
	var lower string
	for _, l := range layers {
		if sameFile(l, filepath.Join(e.dataDir, "templates", base, "image.erofs")) {
			lower = l
		}
	}
	if lower == "" {
		t.Fatalf("no layer in %v is the base's image", layers)
	}
	aside := lower + ".aside"
	if err := os.Rename(lower, aside); err != nil {
		t.Fatal(err)
	}
	_, err = e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID})
	os.Rename(aside, lower)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusNotFound || !strings.Contains(err.Error(), "layer") {
		t.Errorf("restore with its base layer gone: %v, want a 404 naming the layer", err)
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
