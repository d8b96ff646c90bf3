package volume

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestSizedVolume checks a volume with a size: its contents live in a
// mounted image, writes past the size fail with a clear 507-class error
// and lose nothing written before, the mount survives the store being
// reopened, and Delete and a failed create leave no mount or file.
func TestSizedVolume(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "mkfs.ext4", "sized volumes are ext4 images")
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, SizeMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	v, err := s.Create("alice", "small")
	if err != nil {
		t.Fatal(err)
	}
	vdir := filepath.Join(dir, v.ID)
	t.Cleanup(func() { unmountDisk(vdir) })
	if ok, err := isMountPoint(s.DataDir(v.ID)); err != nil || !ok {
		t.Fatalf("data dir of a sized volume is not a mount point (%v)", err)
	}
	if st, err := os.Stat(filepath.Join(vdir, diskImage)); err != nil || st.Size() != 16<<20 {
		t.Fatalf("image: %v, %v; want 16 MiB", st, err)
	}
	if fi, err := os.Stat(s.DataDir(v.ID)); err != nil || fi.Mode().Perm() != 0o777 {
		t.Fatalf("top of the volume: %v %v, want mode 0777", fi, err)
	}
	if _, err := s.WriteFile(v.ID, "/keep.txt", strings.NewReader("kept"), Attrs{}, true); err != nil {
		t.Fatal(err)
	}
	_, err = s.WriteFile(v.ID, "/big", io.LimitReader(zeroReader{}, 32<<20), Attrs{}, true)
	if !errors.Is(err, errdefs.ErrInsufficientStorage) || !strings.Contains(err.Error(), "volume is full") {
		t.Fatalf("writing 32 MiB into a 16 MiB volume: %v, want the volume-full error", err)
	}
	if _, err := s.Stat(v.ID, "/big"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the file cut short by a full volume: %v, want it removed", err)
	}

	// Reopened (a server restart): the mount is found, not made twice.
	s.cfg.InUse = func(string) []string { return []string{"sbx"} }
	s.Close() // in use: stays mounted
	if ok, _ := isMountPoint(s.DataDir(v.ID)); !ok {
		t.Fatal("Close unmounted a volume a sandbox mounts")
	}
	s2, err := Open(Config{Dir: dir, SizeMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	f, err := s2.ReadFile(v.ID, "/keep.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "kept" {
		t.Fatalf("after reopen: %q", b)
	}
	if n := mountCount(t, s2.DataDir(v.ID)); n != 1 {
		t.Fatalf("the volume is mounted %d times after a reopen, want 1", n)
	}
	s2.Close() // nobody mounts it: unmounted
	if ok, _ := isMountPoint(s2.DataDir(v.ID)); ok {
		t.Fatal("Close left an unused volume mounted")
	}
	s3, err := Open(Config{Dir: dir, SizeMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if err := s3.Delete("alice", v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(vdir); !os.IsNotExist(err) {
		t.Fatalf("deleted volume's directory: %v", err)
	}
}

// TestSizedVolumeCreateFails checks a create whose image cannot be made
// leaves nothing behind.
func TestSizedVolumeCreateFails(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	t.Setenv("PATH", t.TempDir()) // no mkfs.ext4
	s, err := Open(Config{Dir: dir, SizeMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create("alice", "v"); err == nil || !strings.Contains(err.Error(), "--volume-size-mb 0") {
		t.Fatalf("create without mkfs.ext4: %v, want an error naming the flag", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("a failed create left %s", e.Name())
		}
	}
	if len(s.Volumes("")) != 0 {
		t.Fatal("a failed create is listed")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func mountCount(t *testing.T, p string) int {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == p {
			n++
		}
	}
	return n
}
