package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// memory imitates a sandbox's pages file across checkpoints: pages change
// in place and runs of pages shift when earlier ones are added, as gVisor's
// do.
type memory struct {
	rng  *rand.Rand
	data []byte
}

func newMemory(seed uint64, pages int) *memory {
	m := &memory{rng: rand.New(rand.NewPCG(seed, 1)), data: make([]byte, pages*PageSize)}
	m.fill(m.data)
	return m
}

func (m *memory) fill(b []byte) {
	for i := range b {
		b[i] = byte(m.rng.Uint32())
	}
}

// change rewrites n bytes (whole pages at random places) and inserts a few
// new pages near the start, shifting the rest; it returns the bytes changed.
func (m *memory) change(n int) int {
	for done := 0; done < n; done += PageSize {
		p := m.rng.IntN(len(m.data) / PageSize)
		m.fill(m.data[p*PageSize : (p+1)*PageSize])
	}
	ins := make([]byte, 3*PageSize)
	m.fill(ins)
	at := 2 * PageSize
	m.data = append(m.data[:at], append(ins, m.data[at:]...)...)
	return n + len(ins)
}

func ckpt(t testing.TB, s *Store, files map[string][]byte) string {
	t.Helper()
	dir, err := s.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// restored checks that a restore of sn gives back exactly files.
func restored(t testing.TB, s *Store, id string, files map[string][]byte) {
	t.Helper()
	dir, done, release, err := s.Acquire(id)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	defer done()
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("snapshot %s file %s: restored %d bytes that differ from the %d taken", id, name, len(got), len(want))
		}
	}
}

// diskBytes walks the chunks directory: what the store really holds on
// disk (chunks are sparse where their shared pages were punched out).
func diskBytes(t testing.TB, s *Store) int64 {
	t.Helper()
	var n int64
	entries, err := os.ReadDir(filepath.Join(s.dir, "chunks"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		st, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += diskSize(st)
	}
	return n
}

func TestIncrementalChainStoresWhatChanged(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mem := newMemory(1, 2048) // 8 MiB
	state := []byte("process state")
	var ids []string
	var taken []map[string][]byte
	var first int64
	for i := range 10 {
		changed := 0
		if i > 0 {
			changed = mem.change(256 << 10)
		}
		// A state file that differs each time but compresses (as gVisor's).
		st := append(bytes.Repeat(state, 16<<10), byte(i))
		files := map[string][]byte{"pages.img": bytes.Clone(mem.data), "checkpoint.img": st, "empty.img": {}}
		sn, err := s.Add(ckpt(t, s, files), Snapshot{Sandbox: "sb-1"})
		if err != nil {
			t.Fatal(err)
		}
		if c := sn.Files["checkpoint.img"].Extents[0].Chunk; !compressed(c) {
			t.Errorf("state file of %d bytes stored as chunk %s, want it compressed", len(st), c)
		}
		if i == 0 {
			first = diskBytes(t, s)
		} else if limit := int64(2*changed + 2*PageSize); sn.Stored > limit {
			t.Errorf("snapshot %d stored %d bytes for %d changed, want at most %d", i, sn.Stored, changed, limit)
		}
		ids, taken = append(ids, sn.ID), append(taken, files)
	}
	if got, max := diskBytes(t, s)-first, int64(9*2*(256<<10+3*PageSize)); got > max {
		t.Errorf("chain of 10 stores %d bytes beyond the first, want at most %d", got, max)
	}
	if got := s.StoredBytes(); got != diskBytes(t, s) {
		t.Errorf("StoredBytes = %d, chunks on disk = %d", got, diskBytes(t, s))
	}
	for i, id := range ids {
		restored(t, s, id, taken[i])
	}

	// Deleting the first keeps what the others reference.
	if err := s.Delete(ids[0]); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(ids); i++ {
		restored(t, s, ids[i], taken[i])
	}
	// And a reopened store restores them too.
	s, err = Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	restored(t, s, ids[9], taken[9])
	for _, id := range ids[1:] {
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
	if n := diskBytes(t, s); n != 0 {
		t.Errorf("%d chunk bytes left after deleting every snapshot", n)
	}
	if left, _ := os.ReadDir(filepath.Join(s.dir, "index")); len(left) != 0 {
		t.Errorf("page indexes left after deleting every snapshot: %v", left)
	}
}

// TestConcurrentSnapshotsRestoresDeletes races snapshots of several
// sandboxes against restores of them and a deleter that removes every
// snapshot but the newest (the bases the next snapshots dedupe against):
// no snapshot may be taken referencing a chunk that went, no restore may
// differ, and nothing may be left at the end.
func TestConcurrentSnapshotsRestoresDeletes(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	stop := make(chan struct{})
	deleter := make(chan struct{})
	go func() {
		defer close(deleter)
		for {
			select {
			case <-stop:
				return
			default:
			}
			all := s.ListAll()
			var newest Snapshot
			for _, sn := range all {
				if sn.CreatedAt.After(newest.CreatedAt) {
					newest = sn
				}
			}
			for _, sn := range all {
				if sn.ID != newest.ID {
					s.Delete(sn.ID) // in use (being restored): refused, fine
				}
			}
		}
	}()
	for w := range 4 {
		wg.Go(func() {
			mem := newMemory(uint64(w), 256)
			for i := range 12 {
				if i > 0 {
					mem.change(16 << 10)
				}
				files := map[string][]byte{"pages.img": bytes.Clone(mem.data)}
				sn, err := s.Add(ckpt(t, s, files), Snapshot{Sandbox: fmt.Sprint("sb-", w%2)}) // two writers per sandbox
				if err != nil {
					errs <- fmt.Errorf("snapshot: %w", err)
					return
				}
				dir, done, release, err := s.Acquire(sn.ID)
				if errors.Is(err, errdefs.ErrNotFound) {
					continue // the deleter was first
				}
				if err != nil {
					errs <- fmt.Errorf("restore: %w", err)
					return
				}
				got, err := os.ReadFile(filepath.Join(dir, "pages.img"))
				if err != nil || !bytes.Equal(got, files["pages.img"]) {
					errs <- fmt.Errorf("snapshot %s restored other bytes (%v)", sn.ID, err)
				}
				done()
				release()
			}
		})
	}
	wg.Wait()
	close(stop)
	<-deleter
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, sn := range s.ListAll() {
		if err := s.Delete(sn.ID); err != nil {
			t.Error(err)
		}
	}
	if n := diskBytes(t, s); n != 0 {
		t.Errorf("%d chunk bytes left after deleting every snapshot", n)
	}
}

func TestCrashLeavesNoBrokenSnapshot(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mem := newMemory(7, 64)
	a, err := s.Add(ckpt(t, s, map[string][]byte{"pages.img": mem.data}), Snapshot{Sandbox: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	// A crash after a chunk was written, before its metadata: an orphan.
	orphan := filepath.Join(s.dir, "chunks", "w-"+fmt.Sprintf("%064x", 1))
	os.WriteFile(orphan, []byte("orphan"), 0o600)
	// Metadata naming a chunk that is not there (a lost write).
	broken := a
	broken.ID = "snap-broken"
	broken.Files = map[string]File{"pages.img": {Size: 6, Extents: []Extent{{Chunk: "w-" + fmt.Sprintf("%064x", 2), Len: 6}}}}
	b, _ := json.Marshal(broken)
	os.WriteFile(filepath.Join(s.dir, "meta", "snap-broken.json"), b, 0o600)

	s, err = Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan chunk still there after reopen: %v", err)
	}
	if s.Has("snap-broken") {
		t.Error("a snapshot whose chunk is missing was loaded")
	}
	restored(t, s, a.ID, map[string][]byte{"pages.img": mem.data})
}

func TestLegacyBlobsAreConverted(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	content := []byte("pages of an old snapshot")
	h := "3b0a1c4b9c3ad1ab30a4c3cd3f04ae0a2a70e9ddd43cbaec8d44c5c0a4c3bb6e" // any name: old blobs were not checked on load
	os.MkdirAll(filepath.Join(dir, "blobs"), 0o700)
	os.WriteFile(filepath.Join(dir, "blobs", h), content, 0o600)
	old := fmt.Sprintf(`{"snapshotID":"snap-old","templateID":"busybox","files":{"pages.img":%q},"sizeBytes":%d}`, h, len(content))
	os.WriteFile(filepath.Join(dir, "meta", "snap-old.json"), []byte(old), 0o600)
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	sn, err := s.Get("snap-old")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Template != "busybox" {
		t.Errorf("template = %q after conversion", sn.Template)
	}
	restored(t, s, "snap-old", map[string][]byte{"pages.img": content})
}

// TestImportFetchesOnlyMissingChunks copies a chain between two stores as
// the fleet does.
func TestImportFetchesOnlyMissingChunks(t *testing.T) {
	src, _ := Open(t.TempDir())
	dst, _ := Open(t.TempDir())
	mem := newMemory(3, 1024)
	var snaps []Snapshot
	var taken []map[string][]byte
	for i := range 3 {
		if i > 0 {
			mem.change(64 << 10)
		}
		files := map[string][]byte{"pages.img": bytes.Clone(mem.data), "checkpoint.img": bytes.Repeat([]byte{byte(i)}, 100<<10)}
		sn, err := src.Add(ckpt(t, src, files), Snapshot{Sandbox: "sb"})
		if err != nil {
			t.Fatal(err)
		}
		snaps, taken = append(snaps, sn), append(taken, files)
	}
	var fetched int
	fetch := func(id string, corrupt bool) func(string, int64, string) error {
		return func(chunk string, _ int64, to string) error {
			p, err := src.ChunkPath(id, chunk)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if corrupt {
				b[0] ^= 1
			}
			fetched++
			f, err := os.Create(to)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = CopySparse(f, bytes.NewReader(b), 0)
			return err
		}
	}
	manifest := func(sn Snapshot) Snapshot {
		m, err := src.Manifest(sn.ID)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if _, err := dst.Import(snaps[2].ID, manifest(snaps[2]), fetch(snaps[2].ID, true)); err == nil {
		t.Fatal("import of a corrupt chunk succeeded")
	}
	if _, err := dst.Import(snaps[1].ID, manifest(snaps[1]), fetch(snaps[1].ID, false)); err != nil {
		t.Fatal(err)
	}
	fetched = 0
	before := diskBytes(t, dst)
	if _, err := dst.Import(snaps[2].ID, manifest(snaps[2]), fetch(snaps[2].ID, false)); err != nil {
		t.Fatal(err)
	}
	if fetched != 2 {
		t.Errorf("second import fetched %d chunks, want 2 (its new pages and its state file)", fetched)
	}
	if added, max := diskBytes(t, dst)-before, int64(2*(64<<10+3*PageSize)); added > max {
		t.Errorf("second import added %d bytes on disk, want at most %d (what changed)", added, max)
	}
	restored(t, dst, snaps[2].ID, taken[2])
	restored(t, dst, snaps[1].ID, taken[1])

	// The sandbox goes on on this node: its next snapshot shares the
	// copied ones' pages (they had no page index here).
	changed := mem.change(64 << 10)
	next, err := dst.Add(ckpt(t, dst, map[string][]byte{"pages.img": bytes.Clone(mem.data)}), Snapshot{Sandbox: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	if max := int64(2 * changed); next.Stored > max {
		t.Errorf("snapshot after a copy stored %d bytes for %d changed, want at most %d", next.Stored, changed, max)
	}
	restored(t, dst, next.ID, map[string][]byte{"pages.img": mem.data})

}

func TestGCCountsSharedChunksOnce(t *testing.T) {
	s, _ := Open(t.TempDir())
	mem := newMemory(5, 256) // 1 MiB
	for range 3 {
		mem.change(8 << 10)
		if _, err := s.Add(ckpt(t, s, map[string][]byte{"pages.img": bytes.Clone(mem.data)}), Snapshot{Sandbox: "sb", Kind: KindAuto, CreatedAt: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	// Three 1 MiB snapshots share most pages: well under 2 MiB stored, so a
	// 2 MiB limit deletes nothing.
	if got := s.GC(Policy{MaxBytes: 2 << 20}); len(got) != 0 {
		t.Errorf("GC deleted %v under a limit the shared chunks fit in (%d bytes stored)", got, s.StoredBytes())
	}
	if got := s.GC(Policy{MaxBytes: 1}); len(got) != 3 {
		t.Errorf("GC under a 1-byte limit deleted %v, want all 3", got)
	}
}

func TestCopySparseKeepsHoles(t *testing.T) {
	data := make([]byte, 64*PageSize)
	for i := range data[:8*PageSize] {
		data[i] = byte(i%251 + 1)
	}
	copy(data[40*PageSize:], data[:PageSize]) // data, then zeros to the end
	f, err := os.Create(filepath.Join(t.TempDir(), "chunk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A transfer cut after 10 pages, then resumed from the file's end.
	if _, err := CopySparse(f, io.MultiReader(bytes.NewReader(data[:10*PageSize]), errReader{}), 0); err == nil {
		t.Fatal("a cut transfer reported success")
	}
	st, _ := f.Stat()
	if _, err := CopySparse(f, bytes.NewReader(data[st.Size():]), st.Size()); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got, data) {
		t.Fatalf("copied %d bytes that differ from the %d sent", len(got), len(data))
	}
	st, _ = f.Stat()
	if used := diskSize(st); used > 16*PageSize {
		t.Errorf("file takes %d bytes on disk, want at most %d (9 pages of data, the rest holes)", used, 16*PageSize)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
