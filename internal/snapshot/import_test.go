package snapshot

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// peerSnapshots is a source store (another node) holding two snapshots of
// one sandbox, the second sharing pages with the first: their manifests
// and their files.
func peerSnapshots(t *testing.T) (*Store, []Snapshot, []map[string][]byte) {
	t.Helper()
	src, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mem := newMemory(11, 256)
	var snaps []Snapshot
	var taken []map[string][]byte
	for i := range 2 {
		if i > 0 {
			mem.change(16 << 10)
		}
		files := map[string][]byte{"pages.img": bytes.Clone(mem.data), "checkpoint.img": bytes.Repeat([]byte{byte(i + 1)}, 64<<10)}
		sn, err := src.Add(ckpt(t, src, files), Snapshot{Sandbox: "sb", Template: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		m, err := src.Manifest(sn.ID)
		if err != nil {
			t.Fatal(err)
		}
		snaps, taken = append(snaps, m), append(taken, files)
	}
	return src, snaps, taken
}

// peerFetch fetches chunks from src as the fleet does; alias maps a chunk
// name a lying manifest uses to the real one, and lie changes the bytes.
func peerFetch(src *Store, id string, alias map[string]string, lie func([]byte) []byte) func(string, int64, string) error {
	return func(chunk string, _ int64, to string) error {
		real := chunk
		if a, ok := alias[chunk]; ok {
			real = a
		}
		p, err := src.ChunkPath(id, real)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if lie != nil {
			b = lie(b)
		}
		f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = CopySparse(f, bytes.NewReader(b), 0)
		return err
	}
}

// tree lists every file under dir with its content's hash.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		sum := sha256.Sum256(b)
		out[p] = hex.EncodeToString(sum[:])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// newPages returns the chunk of sn's pages that base lacks.
func newPages(t *testing.T, sn, base Snapshot) string {
	t.Helper()
	for _, e := range sn.Files["pages.img"].Extents {
		if _, ok := base.Chunks[e.Chunk]; !ok && !compressed(e.Chunk) {
			return e.Chunk
		}
	}
	t.Fatal("no new pages chunk")
	return ""
}

// A peer's description is refused unless it is the snapshot asked for,
// with every chunk named by its content and bounded by a declared size,
// and the chunks hold what their names say; a failed import leaves the
// store (and what is outside it) as it was, and a held snapshot is never
// replaced.
func TestImportRefusesWhatAPeerGetsWrong(t *testing.T) {
	src, snaps, taken := peerSnapshots(t)
	root := t.TempDir()
	dst, err := Open(filepath.Join(root, "store"))
	if err != nil {
		t.Fatal(err)
	}
	held := snaps[0]
	if _, err := dst.Import(held.ID, held, peerFetch(src, held.ID, nil, nil)); err != nil {
		t.Fatalf("importing an honest snapshot: %v", err)
	}
	heldMeta, _ := dst.Get(held.ID)
	next := snaps[1]
	chunk := newPages(t, next, held)

	for _, tc := range []struct {
		name  string
		ask   string
		lie   func(sn *Snapshot) // what the peer changes in its description
		bytes func([]byte) []byte
		alias map[string]string
		class error
	}{
		{name: "traversal ID", ask: "../../../../pwned", lie: func(sn *Snapshot) { sn.ID = "../../../../pwned" }, class: errdefs.ErrInvalid},
		{name: "answer for another ID", ask: next.ID, lie: func(sn *Snapshot) { sn.ID = NewID() }, class: errdefs.ErrInvalid},
		{name: "held ID, other description", ask: held.ID, lie: func(sn *Snapshot) { sn.ID = held.ID }, class: errdefs.ErrConflict},
		{name: "internal", ask: next.ID, lie: func(sn *Snapshot) { sn.Internal, sn.Name = true, "ready:busybox" }, class: errdefs.ErrInvalid},
		{name: "traversal parent", ask: next.ID, lie: func(sn *Snapshot) { sn.Parent = "../x" }, class: errdefs.ErrInvalid},
		{name: "file outside its directory", ask: next.ID, lie: func(sn *Snapshot) {
			sn.Files["../x"] = sn.Files["pages.img"]
			delete(sn.Files, "pages.img")
		}, class: errdefs.ErrInvalid},
		{name: "size is not the files'", ask: next.ID, lie: func(sn *Snapshot) { sn.Size++ }, class: errdefs.ErrInvalid},
		{name: "u- chunk", ask: next.ID, lie: func(sn *Snapshot) { renameChunk(sn, chunk, "u-0123456789abcdef-pages.img") },
			alias: map[string]string{"u-0123456789abcdef-pages.img": chunk}, class: errdefs.ErrInvalid},
		{name: "chunk with no declared size", ask: next.ID, lie: func(sn *Snapshot) { delete(sn.Chunks, chunk) }, class: errdefs.ErrInvalid},
		{name: "extent past its chunk", ask: next.ID, lie: func(sn *Snapshot) { sn.Chunks[chunk] = PageSize }, class: errdefs.ErrInvalid},
		{name: "chunk of a petabyte", ask: next.ID, lie: func(sn *Snapshot) { sn.Chunks[chunk] = 1 << 50 }, class: errdefs.ErrResourceExhausted},
		{name: "chunk bytes differ", ask: next.ID, bytes: func(b []byte) []byte {
			b[len(b)-1] ^= 1
			return b
		}, class: errdefs.ErrUnavailable},
		{name: "chunk longer than declared", ask: next.ID, bytes: func(b []byte) []byte { return append(b, 1) }, class: errdefs.ErrUnavailable},
		{name: "chunk shorter than declared", ask: next.ID, bytes: func(b []byte) []byte { return b[:len(b)-1] }, class: errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sn := next
			sn.Files = maps.Clone(next.Files)
			sn.Chunks = maps.Clone(next.Chunks)
			if tc.lie != nil {
				tc.lie(&sn)
			}
			before := tree(t, root)
			_, err := dst.Import(tc.ask, sn, peerFetch(src, next.ID, tc.alias, tc.bytes))
			if !errors.Is(err, tc.class) {
				t.Fatalf("import: got %v, want an error of class %v", err, tc.class)
			}
			if after := tree(t, root); !maps.Equal(after, before) {
				t.Errorf("a failed import changed the files under %s:\nbefore %v\nafter  %v", root, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
			}
			if got, _ := dst.Get(held.ID); !sameSnapshot(got, heldMeta) {
				t.Errorf("held snapshot changed: got %+v, want %+v", got, heldMeta)
			}
			if tc.ask != held.ID && dst.Has(tc.ask) {
				t.Errorf("a refused import left snapshot %s", tc.ask)
			}
		})
	}
	restored(t, dst, held.ID, taken[0])
	if _, err := dst.Import(next.ID, next, peerFetch(src, next.ID, nil, nil)); err != nil {
		t.Fatalf("the honest description after the lies: %v", err)
	}
}

func renameChunk(sn *Snapshot, from, to string) {
	for name, f := range sn.Files {
		f.Extents = slices.Clone(f.Extents)
		for i := range f.Extents {
			if f.Extents[i].Chunk == from {
				f.Extents[i].Chunk = to
			}
		}
		sn.Files[name] = f
	}
	sn.Chunks[to] = sn.Chunks[from]
	delete(sn.Chunks, from)
}

func sameSnapshot(a, b Snapshot) bool {
	return a.ID == b.ID && a.Size == b.Size && a.CreatedAt.Equal(b.CreatedAt) && maps.EqualFunc(a.Files, b.Files, func(x, y File) bool {
		return x.Size == y.Size && slices.Equal(x.Extents, y.Extents)
	})
}

// Imports of one snapshot racing each other store it once; the others
// are refused, not overwrites.
func TestConcurrentImportsOfOneSnapshot(t *testing.T) {
	src, snaps, _ := peerSnapshots(t)
	dst, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sn := snaps[1]
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = dst.Import(sn.ID, sn, peerFetch(src, sn.ID, nil, nil)) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrConflict):
			t.Errorf("racing import: %v, want success or a conflict", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d imports succeeded, want 1", ok)
	}
}

// A deflated chunk is checked against the hash of its bytes, not of what
// it inflates to: a restore inflates no more than the file's size.
func TestRestoreBoundsInflate(t *testing.T) {
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestCompression)
	w.Write(make([]byte, 64<<20)) // 64 MiB of zeros in ~64 KiB
	w.Close()
	sum := sha256.Sum256(buf.Bytes())
	chunk := "z-" + hex.EncodeToString(sum[:])
	id := NewID()
	sn := Snapshot{ID: id, Size: 100, Files: map[string]File{"checkpoint.img": {Size: 100, Extents: []Extent{{Chunk: chunk, Len: 100}}}},
		Chunks: map[string]int64{chunk: int64(buf.Len())}}
	dst, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = dst.Import(id, sn, func(_ string, _ int64, to string) error { return os.WriteFile(to, buf.Bytes(), 0o600) })
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := dst.Acquire(id); err == nil {
		t.Fatal("restoring a chunk that inflates past its file's size succeeded")
	}
	entries, _ := os.ReadDir(filepath.Join(dst.dir, "tmp"))
	if len(entries) != 0 {
		t.Errorf("the failed restore left %d entries in tmp/", len(entries))
	}
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{NewID(), true},
		{"snap-0123456789abcdef", true},
		{"snap-0123456789ABCDEF", false},
		{"snap-0123456789abcde", false},
		{"snap-0123456789abcdef0", false},
		{"snap-../../../../pwned", false},
		{"../snap-0123456789abcdef", false},
		{"", false},
		{"snap-", false},
	} {
		if got := ValidID(tc.id) == nil; got != tc.want {
			t.Errorf("ValidID(%q) ok = %v, want %v", tc.id, got, tc.want)
		}
	}
}

// Metadata whose ID is not its file's name (left by an import before IDs
// were checked) is not loaded.
func TestOpenDropsMetadataNamedOtherwise(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Add(ckpt(t, s, map[string][]byte{"pages.img": newMemory(3, 4).data}), Snapshot{Sandbox: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	other := NewID()
	b, _ := os.ReadFile(filepath.Join(dir, "meta", a.ID+".json"))
	os.WriteFile(filepath.Join(dir, "meta", other+".json"), b, 0o600)
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Has(other) {
		t.Errorf("metadata of %s under the name %s was loaded", a.ID, other)
	}
	if !s.Has(a.ID) {
		t.Errorf("snapshot %s lost", a.ID)
	}
}
