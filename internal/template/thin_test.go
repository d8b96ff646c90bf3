package template_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
)

// readImage reads a file of an EROFS image (mounted for the read).
func readImage(t *testing.T, image, name string) (string, error) {
	t.Helper()
	mnt := t.TempDir()
	if err := template.MountImage(image, mnt); err != nil {
		t.Fatal(err)
	}
	defer template.Unmount(mnt)
	b, err := os.ReadFile(filepath.Join(mnt, name))
	return string(b), err
}

// A thin template from a tree of changes: its image holds the changes and
// nothing the base has the same (envd, /etc/passwd edited on the base's,
// not shadowing it); a new envd goes into its layer and it stays thin;
// the base's layer outlives the base's own rebuild.
func TestThinStoreAndRefreshEnvd(t *testing.T) {
	s, dir := openStore(t, template.Options{})
	ctx := context.Background()
	if _, err := s.Build(ctx, template.BuildRequest{Name: "base", Busybox: true}, noProgress); err != nil {
		t.Fatal(err)
	}
	digests, _, release, err := s.BuildStack("base")
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	os.MkdirAll(filepath.Join(tree, "task"), 0o755)
	os.WriteFile(filepath.Join(tree, "task", "f"), []byte("task\n"), 0o644)
	thin, err := s.Build(ctx, template.BuildRequest{Name: "thin", Tree: tree, Lowers: digests}, noProgress)
	release()
	if err != nil {
		t.Fatal(err)
	}
	if len(thin.Lowers) != 1 || thin.Lowers[0] != digests[0] {
		t.Fatalf("thin's lowers %v, want %v", thin.Lowers, digests)
	}
	image := s.ImagePath("thin")
	if got, err := readImage(t, image, "task/f"); err != nil || got != "task\n" {
		t.Errorf("/task/f in the thin image: %q, %v", got, err)
	}
	for _, same := range []string{".agentenv/envd", "etc/passwd", "bin/busybox"} {
		if _, err := readImage(t, image, same); err == nil {
			t.Errorf("/%s is in the thin image, though the base has it the same", same)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "thin", "rootfs")); err == nil {
		t.Error("a thin template kept a tree beside its image")
	}

	// A new envd: both are refreshed, the thin one stays thin and carries it.
	envd2 := filepath.Join(t.TempDir(), "envd")
	b, _ := os.ReadFile(builtEnvd(t))
	os.WriteFile(envd2, append(b, []byte("\n# another build\n")...), 0o755)
	s2, err := template.OpenWithOptions(dir, envd2, template.Options{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.RefreshEnvd(ctx); err != nil {
		t.Fatal(err)
	}
	thin2, err := s2.Get("thin")
	if err != nil {
		t.Fatal(err)
	}
	if len(thin2.Lowers) != 1 || thin2.Lowers[0] != digests[0] || thin2.EnvdHash == thin.EnvdHash {
		t.Errorf("after a new envd: lowers %v envd %s, want the old base layer and a new envd", thin2.Lowers, thin2.EnvdHash)
	}
	if got, err := readImage(t, s2.ImagePath("thin"), ".agentenv/envd"); err != nil || !strings.HasSuffix(got, "# another build\n") {
		t.Errorf("the thin image lacks the new envd: %v", err)
	}
	if got, err := readImage(t, s2.ImagePath("thin"), "task/f"); err != nil || got != "task\n" {
		t.Errorf("/task/f after the refresh: %q, %v", got, err)
	}
	if !s2.HasLayer(digests[0]) {
		t.Error("the base's old image, still thin's layer, went with the base's refresh")
	}
	if thin2.OwnBytes > 64<<10+int64(len(b)) {
		t.Errorf("thin takes %d bytes after the refresh, want about envd's %d", thin2.OwnBytes, len(b))
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), dir) {
		t.Errorf("mounts left under the store %s", dir)
	}
}
