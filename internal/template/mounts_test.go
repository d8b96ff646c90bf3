package template

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/testenv"
)

// A mount debootstrap left in a tree (its /proc, and one below it) is
// detached, deepest first; mounts beside the tree stay.
func TestUnmountUnder(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	tree := filepath.Join(dir, "rootfs")
	other := filepath.Join(dir, "rootfs-other")
	for _, d := range []string{filepath.Join(tree, "proc"), other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("proc", filepath.Join(tree, "proc"), "proc", 0, ""); err != nil {
		t.Fatalf("mount proc: %v", err)
	}
	if err := unix.Mount("tmpfs", other, "tmpfs", 0, ""); err != nil {
		unix.Unmount(filepath.Join(tree, "proc"), unix.MNT_DETACH)
		t.Fatalf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(other, unix.MNT_DETACH)
	if err := unmountUnder(tree); err != nil {
		t.Fatalf("unmountUnder: %v", err)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(b), " "+tree+"/proc ") {
		t.Errorf("%s/proc is still mounted", tree)
	}
	if !strings.Contains(string(b), " "+other+" ") {
		t.Errorf("%s (beside the tree) was unmounted", other)
	}
}
