package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Import adds snapshot sn, the description (Manifest) another node sent
// when asked for snapshot id, fetching into this store only the chunks it
// lacks: fetch writes chunk name, which the description says holds size
// bytes, to the new file dst. Nothing in sn is taken on trust: it must
// pass CheckManifest, each fetched chunk must hold exactly its declared
// size and the content its name says, and what is fetched must fit on
// the file system. A snapshot the store holds is never replaced
// (ErrConflict). A failed import leaves nothing behind.
func (s *Store) Import(id string, sn Snapshot, fetch func(chunk string, size int64, dst string) error) (Snapshot, error) {
	if err := CheckManifest(id, sn); err != nil {
		return Snapshot{}, err
	}
	if s.Has(id) {
		return Snapshot{}, errdefs.Conflict("snapshot %s is already stored on this node: not replaced", id)
	}
	dir, err := s.TempDir()
	if err != nil {
		return Snapshot{}, err
	}
	defer os.RemoveAll(dir)
	want := sn.chunks()
	have := map[string]bool{}
	s.mu.Lock()
	for c := range want {
		if s.chunkRefs[c] > 0 || s.pins[c] > 0 {
			have[c] = true
			s.pins[c]++
		}
	}
	s.mu.Unlock()
	defer s.unpin(have)
	var names []string
	var total int64
	for c := range want {
		if !have[c] {
			names = append(names, c)
			total += sn.Chunks[c] // CheckManifest bounded each: no overflow
		}
	}
	sort.Strings(names)
	if free, err := freeBytes(s.dir); err == nil && total > free {
		return Snapshot{}, fmt.Errorf("snapshot %s: its chunks this node lacks declare %d bytes, %d are free: %w",
			id, total, free, errdefs.ErrResourceExhausted)
	}
	var fresh []newChunk
	for _, c := range names {
		dst := filepath.Join(dir, c)
		if err := fetch(c, sn.Chunks[c], dst); err != nil {
			return Snapshot{}, fmt.Errorf("snapshot %s chunk %s: %w", id, c, err)
		}
		if err := checkFetched(c, sn.Chunks[c], dst); err != nil {
			return Snapshot{}, errdefs.Unavailable("snapshot %s: %v: refused", id, err)
		}
		fresh = append(fresh, newChunk{name: c, tmp: dst})
	}
	sn.InUse, sn.Stored, sn.Chunks, sn.Timing = 0, 0, nil, Timing{}
	sn.Kind = kindOf(&sn)
	if _, err := s.commit(&sn, fresh, false); err != nil {
		return Snapshot{}, err
	}
	return sn, nil
}

// checkFetched checks that the file a fetch wrote is a regular file of
// the declared size holding the content its name says.
func checkFetched(chunk string, size int64, p string) error {
	st, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Size() != size {
		return fmt.Errorf("chunk %s arrived as %d bytes (%v), its description says %d", chunk, st.Size(), st.Mode().Type(), size)
	}
	return VerifyChunk(chunk, p)
}

// freeBytes is what the file system holding dir has free for its users.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// maxChunkSize bounds a chunk's declared size (1 PiB), far beyond any
// file a checkpoint writes, so that sums of sizes cannot overflow.
const maxChunkSize = 1 << 50

// CheckManifest refuses a snapshot description sent by another node when
// asked for snapshot id unless: its ID is id, and valid (the ID names the
// store's files); it is not internal (internal chunks are not named by
// their content, and an internal snapshot named "ready:<template>" would
// stand in for that template's boots); every chunk is named by its
// content, within the store's directory, with a declared size (Chunks)
// that every extent fits in; and the extents add up to each file's size
// and the files to the snapshot's.
func CheckManifest(id string, sn Snapshot) error {
	if sn.ID != id {
		return errdefs.Invalid("asked for snapshot %q, got the description of %q: refused", id, sn.ID)
	}
	if err := ValidID(id); err != nil {
		return err
	}
	if sn.Internal {
		return errdefs.Invalid("snapshot %s is described as internal: internal snapshots do not leave their node", id)
	}
	if sn.Parent != "" {
		if err := ValidID(sn.Parent); err != nil {
			return errdefs.Invalid("snapshot %s parent: %v", id, err)
		}
	}
	if len(sn.Files) == 0 {
		return errdefs.Invalid("snapshot %s has no files", id)
	}
	for c, n := range sn.Chunks {
		if n <= 0 || n > maxChunkSize {
			return errdefs.Invalid("snapshot %s declares chunk %s of %d bytes: refused", id, c, n)
		}
	}
	var size int64
	for name, f := range sn.Files {
		if !filepath.IsLocal(name) || filepath.Base(name) != name {
			return errdefs.Invalid("snapshot %s names a file %q outside its directory: refused", id, name)
		}
		if err := checkExtents(sn.Chunks, f); err != nil {
			return errdefs.Invalid("snapshot %s file %s: %v: refused", id, name, err)
		}
		if f.Size > maxChunkSize-size {
			return errdefs.Invalid("snapshot %s: its files hold more than %d bytes: refused", id, int64(maxChunkSize))
		}
		size += f.Size
	}
	if size != sn.Size {
		return errdefs.Invalid("snapshot %s: its files hold %d bytes, its size is %d: refused", id, size, sn.Size)
	}
	return nil
}

// checkExtents checks one file's extents against the chunks' declared
// sizes and the file's size.
func checkExtents(chunks map[string]int64, f File) error {
	if f.Size < 0 || f.Size > maxChunkSize {
		return fmt.Errorf("size %d", f.Size)
	}
	var total int64
	for _, e := range f.Extents {
		size, declared := chunks[e.Chunk]
		switch {
		case !contentAddressed(e.Chunk):
			return fmt.Errorf("chunk %q is not named by its content", e.Chunk)
		case !declared:
			return fmt.Errorf("chunk %s has no declared size", e.Chunk)
		case e.Off < 0 || e.Len <= 0 || e.Len > f.Size-total:
			return fmt.Errorf("bad extent %+v", e)
		case compressed(e.Chunk):
			// One deflated chunk is the whole small file.
			if len(f.Extents) != 1 || e.Off != 0 || f.Size > maxCompressed || size > maxCompressed {
				return fmt.Errorf("bad compressed extent %+v of a %d-byte chunk", e, size)
			}
		case e.Off > size || e.Len > size-e.Off:
			return fmt.Errorf("extent %+v lies past the end of its %d-byte chunk", e, size)
		}
		total += e.Len
	}
	if total != f.Size {
		return fmt.Errorf("extents hold %d bytes, size is %d", total, f.Size)
	}
	return nil
}
