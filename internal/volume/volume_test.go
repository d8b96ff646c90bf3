package volume

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
)

func open(t *testing.T, dir string, inUse func(string) []string) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, MaxVolumes: 3, InUse: inUse})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func wantClass(t *testing.T, err, class error, what string) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("%s: got %v, want %v", what, err, class)
	}
}

func TestVolumeLifecycle(t *testing.T) {
	dir := t.TempDir()
	mounted := map[string][]string{}
	s := open(t, dir, func(id string) []string { return mounted[id] })

	v, err := s.Create("alice", "data_1")
	if err != nil {
		t.Fatal(err)
	}
	if !idRE.MatchString(v.ID) {
		t.Fatalf("volume ID %q is not a UUID", v.ID)
	}
	_, err = s.Create("alice", "data_1")
	wantClass(t, err, errdefs.ErrInvalid, "a second volume of the same name")
	if _, err := s.Create("bob", "data_1"); err != nil {
		t.Fatalf("another owner's volume of the same name: %v", err)
	}
	for _, bad := range []string{"", "a b", "../x", strings.Repeat("a", 64), "é"} {
		_, err := s.Create("alice", bad)
		wantClass(t, err, errdefs.ErrInvalid, "name "+bad)
	}
	if _, err := s.Create("alice", "third"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Create("alice", "fourth")
	wantClass(t, err, errdefs.ErrConflict, "a volume over the limit")

	if got := s.Volumes("alice"); len(got) != 2 || got[0].ID != v.ID {
		t.Fatalf("alice's volumes: %+v", got)
	}
	if len(s.Volumes("")) != 3 {
		t.Fatalf("all volumes: %+v", s.Volumes(""))
	}
	_, err = s.Get("bob", v.ID)
	wantClass(t, err, errdefs.ErrNotFound, "bob reading alice's volume")
	_, err = s.Get("alice", "not-a-uuid")
	wantClass(t, err, errdefs.ErrInvalid, "a malformed ID")
	if got, err := s.ByName("alice", "data_1"); err != nil || got.ID != v.ID {
		t.Fatalf("by name: %+v %v", got, err)
	}
	// The default key's owner "" is an owner of its own: alice's and
	// bob's data_1 are not its.
	_, err = s.ByName("", "data_1")
	wantClass(t, err, errdefs.ErrNotFound, "the default owner naming another owner's volume")

	if _, err := s.WriteFile(v.ID, "/a/b.txt", strings.NewReader("hello"), Attrs{}, true); err != nil {
		t.Fatal(err)
	}
	mounted[v.ID] = []string{"sbx1"}
	err = s.Delete("alice", v.ID)
	wantClass(t, err, errdefs.ErrConflict, "deleting a mounted volume")
	if !strings.Contains(err.Error(), "sbx1") {
		t.Fatalf("the refusal does not name the sandbox: %v", err)
	}

	// A reopened store has the same volumes and contents; a directory
	// without a record (a create that died) is removed.
	s.Close()
	os.MkdirAll(filepath.Join(dir, "leftover", "data"), 0o755)
	s = open(t, dir, func(id string) []string { return mounted[id] })
	if _, err := os.Stat(filepath.Join(dir, "leftover")); !os.IsNotExist(err) {
		t.Fatalf("a directory without a record survived Open: %v", err)
	}
	f, err := s.ReadFile(v.ID, "a/b.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "hello" {
		t.Fatalf("read %q after reopening", b)
	}

	delete(mounted, v.ID)
	release, err := s.Hold(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantClass(t, s.Delete("alice", v.ID), errdefs.ErrConflict, "deleting a volume a starting sandbox holds")
	release()
	release() // a second release changes nothing
	if _, err := s.Hold(v.ID, "00000000-0000-4000-8000-000000000000"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("holding an unknown volume: %v", err)
	}
	if err := s.Delete("alice", v.ID); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get("alice", v.ID)
	wantClass(t, err, errdefs.ErrNotFound, "a deleted volume")
	if _, err := os.Stat(filepath.Join(dir, v.ID)); !os.IsNotExist(err) {
		t.Fatalf("the deleted volume's directory is still there: %v", err)
	}
	_, err = s.Stat(v.ID, "/")
	wantClass(t, err, errdefs.ErrNotFound, "contents of a deleted volume")
}

func TestVolumeTokens(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	a, _ := s.Create("", "a")
	b, _ := s.Create("", "b")
	tok := s.Token(a.ID)
	if err := s.CheckToken(a.ID, tok); err != nil {
		t.Fatalf("a fresh token: %v", err)
	}
	for name, bad := range map[string]string{
		"another volume's token": s.Token(b.ID),
		"a changed signature":    tok[:len(tok)-2] + "xx",
		"no prefix":              strings.TrimPrefix(tok, "vt_"),
		"garbage":                "vt_%%%.x",
		"empty":                  "",
	} {
		err := s.CheckToken(a.ID, bad)
		wantClass(t, err, errdefs.ErrUnauthenticated, name)
	}
	// Another store (another key) does not accept the token.
	other := open(t, t.TempDir(), nil)
	wantClass(t, other.CheckToken(a.ID, tok), errdefs.ErrUnauthenticated, "a token of another server")
}

func TestVolumeContent(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	v, _ := s.Create("", "c")
	id := v.ID

	_, err := s.WriteFile(id, "/missing/f", strings.NewReader("x"), Attrs{}, false)
	wantClass(t, err, errdefs.ErrNotFound, "a write under a missing directory without force")
	e, err := s.WriteFile(id, "dir/sub/f.txt", strings.NewReader("abc"), Attrs{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "/dir/sub/f.txt" || e.Name != "f.txt" || e.Type != "file" || e.Size != 3 || e.Mode != DefaultFileMode {
		t.Fatalf("entry of a written file: %+v", e)
	}
	_, err = s.WriteFile(id, "/dir/sub/f.txt", strings.NewReader("x"), Attrs{}, false)
	wantClass(t, err, errdefs.ErrConflict, "overwriting without force")
	mode := uint32(0o600)
	e, err = s.WriteFile(id, "/dir/sub/f.txt", strings.NewReader("new"), Attrs{Mode: &mode}, true)
	if err != nil || e.Size != 3 || e.Mode != 0o600 {
		t.Fatalf("overwrite with force: %+v %v", e, err)
	}
	_, err = s.WriteFile(id, "/dir/sub/f.txt/g", strings.NewReader("x"), Attrs{}, true)
	wantClass(t, err, errdefs.ErrInvalid, "a path through a file")

	_, err = s.MakeDir(id, "/dir", Attrs{}, false)
	wantClass(t, err, errdefs.ErrConflict, "mkdir of an existing directory without force")
	_, err = s.MakeDir(id, "/x/y", Attrs{}, false)
	wantClass(t, err, errdefs.ErrNotFound, "mkdir under a missing parent without force")
	if e, err := s.MakeDir(id, "/x/y", Attrs{}, true); err != nil || e.Type != "directory" || e.Mode != DefaultDirMode {
		t.Fatalf("mkdir -p: %+v %v", e, err)
	}

	top, err := s.ListDir(id, "/", 1)
	if err != nil || len(top) != 2 {
		t.Fatalf("list / depth 1: %+v %v", top, err)
	}
	all, err := s.ListDir(id, "", 1)
	wantClass(t, err, errdefs.ErrInvalid, "an empty path")
	all, err = s.ListDir(id, "/", 5)
	if err != nil || len(all) != 5 { // dir, dir/sub, dir/sub/f.txt, x, x/y
		t.Fatalf("list / depth 5: %+v %v", all, err)
	}
	_, err = s.ListDir(id, "/dir/sub/f.txt", 1)
	wantClass(t, err, errdefs.ErrInvalid, "listing a file")

	// Nothing leaves the volume: not "..", not a symlink.
	if e, err := s.Stat(id, "/../../etc/passwd"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf(".. above the top must stay at the top: %+v %v", e, err)
	}
	os.Symlink("/etc", filepath.Join(s.DataDir(id), "abs"))
	os.Symlink("../../../../../../etc", filepath.Join(s.DataDir(id), "rel"))
	for _, p := range []string{"/abs/passwd", "/rel/passwd"} {
		if f, err := s.ReadFile(id, p); err == nil {
			f.Close()
			t.Fatalf("read %s through a symlink out of the volume", p)
		}
		_, err := s.WriteFile(id, p, strings.NewReader("x"), Attrs{}, true)
		wantClass(t, err, errdefs.ErrInvalid, "a write through "+p)
	}
	if e, err := s.Stat(id, "/abs"); err != nil || e.Type != "symlink" || e.Target != "/etc" {
		t.Fatalf("stat of a symlink: %+v %v", e, err)
	}

	wantClass(t, s.Remove(id, "/"), errdefs.ErrInvalid, "removing the top")
	wantClass(t, s.Remove(id, "/nope"), errdefs.ErrNotFound, "removing a missing path")
	if err := s.Remove(id, "/dir"); err != nil {
		t.Fatal(err)
	}
	_, err = s.Stat(id, "/dir/sub/f.txt")
	wantClass(t, err, errdefs.ErrNotFound, "a removed file")
}

// TestTokenOfAnotherStoresVolume checks that a token another store signed
// (a volume on another node of a fleet) is refused with the same words as
// one for another volume of this store.
func TestTokenOfAnotherStoresVolume(t *testing.T) {
	a, b := open(t, t.TempDir(), nil), open(t, t.TempDir(), nil)
	va, err := a.Create("alice", "a")
	if err != nil {
		t.Fatal(err)
	}
	vb, err := b.Create("alice", "b")
	if err != nil {
		t.Fatal(err)
	}
	err = a.CheckToken(va.ID, b.Token(vb.ID))
	wantClass(t, err, errdefs.ErrUnauthenticated, "another store's token")
	if !strings.Contains(err.Error(), "another volume") {
		t.Errorf("another store's token for its own volume: %v, want 'the token is for another volume'", err)
	}
}

// capMeter admits up to limit bytes, then refuses as the host's disk
// admission does.
type capMeter struct {
	limit, used int64
	closed      int
}

func (m *capMeter) Charge(n int64) error {
	if m.used+n > m.limit {
		return errdefs.InsufficientStorage("no room on the host disk (test)")
	}
	m.used += n
	return nil
}

func (m *capMeter) Close() { m.closed++ }

// TestVolumeWriteMetered: a content-API write is charged while it is
// written; the first refusal stops it with 507's class, the file is
// removed, and the meter is closed. A volume's creation is charged too.
func TestVolumeWriteMetered(t *testing.T) {
	var meters []*capMeter
	limit := int64(64 << 20)
	s, err := Open(Config{Dir: t.TempDir(), MaxVolumes: 3, Meter: func(string) diskmeter.Meter {
		m := &capMeter{limit: limit}
		meters = append(meters, m)
		return m
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	v, err := s.Create("", "metered")
	if err != nil {
		t.Fatal(err)
	}
	if len(meters) != 1 || meters[0].used == 0 {
		t.Errorf("a volume's creation charged %+v, want its file system's bytes", meters)
	}
	limit = 8 << 20
	_, err = s.WriteFile(v.ID, "/big", io.LimitReader(zeroReader{}, 64<<20), Attrs{}, true)
	wantClass(t, err, errdefs.ErrInsufficientStorage, "a write of 64 MiB with 8 MiB admitted")
	if _, err := s.Stat(v.ID, "/big"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the refused write left its file: %v", err)
	}
	if m := meters[len(meters)-1]; m.closed == 0 || m.used > 8<<20 {
		t.Errorf("write's meter %+v, want closed with at most 8 MiB charged", m)
	}
	if _, err := s.WriteFile(v.ID, "/small", strings.NewReader("fits"), Attrs{}, true); err != nil {
		t.Errorf("a small write after the refusal: %v", err)
	}
}

// measuringMeter admits a charge after measuring what the volumes hold, as
// the server's disk admission does when a byte budget is set.
type measuringMeter struct{ s *Store }

func (m measuringMeter) Charge(int64) error { m.s.DiskBytes(); return nil }
func (m measuringMeter) Close()             {}

// TestCreateChargesWithoutTheStoreLock: a volume's creation is charged
// without holding the store's lock, which measuring the volumes takes (with
// a byte budget, every volume create on a node hung).
func TestCreateChargesWithoutTheStoreLock(t *testing.T) {
	var s *Store
	s, err := Open(Config{Dir: t.TempDir(), MaxVolumes: 8, Meter: func(string) diskmeter.Meter { return measuringMeter{s} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	done := make(chan error, 1)
	go func() {
		v, err := s.Create("", "measured")
		if err == nil {
			_, err = s.WriteFile(v.ID, "/f", strings.NewReader("data"), Attrs{}, true)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Create or WriteFile with a meter that measures the volumes did not return within 30 s (deadlock on the store's lock)")
	}
}
