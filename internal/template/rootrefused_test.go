package template

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRootRefused tells os.Root's refusal of a path leading out of the tree
// (a template's hostile symlink) from a plain file-system error.
func TestRootRefused(t *testing.T) {
	dir := t.TempDir()
	os.Symlink("../../../../../../etc", filepath.Join(dir, "rel"))
	os.Symlink("/etc", filepath.Join(dir, "abs"))
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, p := range []string{"rel/passwd", "abs/passwd", "../x"} {
		_, err := r.Open(p)
		if err == nil || !rootRefused(err) {
			t.Errorf("open %s: %v: want a refusal rootRefused recognises", p, err)
		}
	}
	if _, err := r.Open("missing"); err == nil || rootRefused(err) {
		t.Errorf("open of a missing file: %v: a plain ENOENT is not a refusal", err)
	}
}
