package template_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
)

// A tree the server prepared (the step builder's result) is moved into the
// template and finished like any source: envd, user, image.
func TestBuildFromTree(t *testing.T) {
	s, dir, _ := newStore(t)
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "etc", "built-by-steps"), []byte("yes\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	req := template.BuildRequest{Name: "fromtree", Tree: tree, Image: "registry.example/gnu:1",
		Defaults: template.Defaults{Workdir: "/app", Env: map[string]string{"A": "b"}}}
	tpl, err := s.Build(context.Background(), req, noProgress)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	if got, want := tpl.Source, "steps:registry.example/gnu:1"; got != want {
		t.Errorf("got source %q, want %q", got, want)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the tree was not moved: Lstat = %v", err)
	}
	rootfs := filepath.Join(dir, "fromtree", "rootfs")
	fileContains(t, filepath.Join(rootfs, "etc", "built-by-steps"), "yes")
	fileContains(t, filepath.Join(rootfs, "etc", "passwd"), "user:x:1000")
	if _, err := os.Stat(filepath.Join(rootfs, "app")); err != nil {
		t.Errorf("workdir: %v", err)
	}
	if _, err := os.Stat(s.ImagePath("fromtree")); err != nil {
		t.Errorf("image: %v", err)
	}
	noStaging(t, dir)
}

// Clients cannot name a host directory as a tree: the field is not part
// of the wire shape, and an image label alone is refused.
func TestTreeNotFromClients(t *testing.T) {
	var req template.BuildRequest
	if err := json.Unmarshal([]byte(`{"name":"x","tree":"/etc","Tree":"/etc"}`), &req); err != nil {
		t.Fatal(err)
	}
	if req.Tree != "" {
		t.Errorf("got Tree %q from JSON, want it ignored", req.Tree)
	}
	s, _, _ := newStore(t)
	if err := s.Validate(template.BuildRequest{Name: "x", Image: "a/b"}); err == nil {
		t.Error("Validate accepted an image label without an upload or tree")
	}
	if err := s.Validate(template.BuildRequest{Name: "x", Tree: "relative/dir"}); err == nil {
		t.Error("Validate accepted a relative tree")
	}
}
