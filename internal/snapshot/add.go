package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// newChunk is a chunk file an Add wrote and has not yet put in place.
type newChunk struct{ name, tmp string }

// Add moves the files of checkpoint directory dir into the store as
// snapshot sn (its ID, if empty, is generated) and removes dir. A file's
// pages that the sandbox's last snapshots (or the snapshot it was restored
// from) already hold are referenced, not stored again; the others stay in
// one new chunk per file. Internal snapshots are stored whole without
// hashing: a fork waits for them and deletes them at once.
func (s *Store) Add(dir string, sn Snapshot) (Snapshot, error) {
	sn, _, err := s.add(dir, sn, false)
	return sn, err
}

// AddHeld is Add returning the snapshot already held, as Acquire holds
// it, until release: the collector, which takes an internal snapshot
// nothing holds at any time, cannot take it between its store and its
// first restore (a fork's checkpoint).
func (s *Store) AddHeld(dir string, sn Snapshot) (_ Snapshot, release func(), err error) {
	return s.add(dir, sn, true)
}

func (s *Store) add(dir string, sn Snapshot, hold bool) (Snapshot, func(), error) {
	defer os.RemoveAll(dir)
	if sn.ID == "" {
		sn.ID = NewID()
	} else if err := ValidID(sn.ID); err != nil {
		return Snapshot{}, nil, err
	} else if s.Has(sn.ID) { // its page index is about to be written
		return Snapshot{}, nil, errdefs.Conflict("snapshot %s is already stored on this node: not replaced", sn.ID)
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = time.Now().UTC()
	}
	sn.Kind = kindOf(&sn)
	sn.Files, sn.Size, sn.Stored = map[string]File{}, 0, 0
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Snapshot{}, nil, err
	}
	bases := s.pinBases(sn)
	defer s.unpin(bases.chunks)
	var fresh []newChunk
	indexes := map[string][][32]byte{}
	start := time.Now()
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, c, pages, err := s.storeFile(p, e.Name(), sn.Internal, bases)
		if err != nil {
			return Snapshot{}, nil, fmt.Errorf("store checkpoint file %s: %w", e.Name(), err)
		}
		sn.Files[e.Name()] = f
		sn.Size += f.Size
		if c.name != "" {
			fresh = append(fresh, c)
		}
		if pages != nil {
			indexes[e.Name()] = pages
		}
	}
	if len(sn.Files) == 0 {
		return Snapshot{}, nil, errors.New("checkpoint wrote no files")
	}
	hashed := time.Now()
	if err := s.writeIndex(sn.ID, indexes); err != nil {
		return Snapshot{}, nil, err
	}
	release, err := s.commit(&sn, fresh, hold)
	if err != nil {
		os.RemoveAll(filepath.Join(s.dir, "index", sn.ID))
		return Snapshot{}, nil, err
	}
	sn.Timing = Timing{Hash: bases.took + hashed.Sub(start) - bases.writeTook, Write: time.Since(hashed) + bases.writeTook}
	return sn, release, nil
}

// storeFile plans how file p is stored and writes the chunk it adds, if
// any. It returns the page hashes (nil for internal snapshots) for the
// index.
func (s *Store) storeFile(p, name string, internal bool, b *bases) (File, newChunk, [][32]byte, error) {
	st, err := os.Stat(p)
	if err != nil {
		return File{}, newChunk{}, nil, err
	}
	size := st.Size()
	whole := func(chunk string) File {
		return File{Size: size, Extents: []Extent{{Chunk: chunk, Len: size}}}
	}
	if internal {
		c := "u-" + NewID()[len("snap-"):] + "-" + name
		return whole(c), newChunk{name: c, tmp: p}, nil, nil
	}
	if size == 0 {
		return File{Extents: []Extent{}}, newChunk{}, [][32]byte{}, nil
	}
	fd, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return File{}, newChunk{}, nil, err
	}
	defer fd.Close()
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return File{}, newChunk{}, nil, fmt.Errorf("mmap: %w", err)
	}
	defer unix.Munmap(data)
	pages := pageHashes(data)
	pl := planFile(size, pages, b.pages, true)
	// Mostly new: keep the file whole (a rename); it then costs at most
	// twice what changed.
	if 2*len(pl.newPages) >= len(pages) {
		if c, err := compress(p+".z", data); err != nil || c != "" {
			return whole(c), newChunk{name: c, tmp: p + ".z"}, pages, err
		}
		c := chunkName(pages)
		return whole(c), newChunk{name: c, tmp: p}, pages, nil
	}
	if len(pl.newPages) == 0 {
		return File{Size: size, Extents: pl.extents}, newChunk{}, pages, nil
	}
	w := time.Now()
	defer func() { b.writeTook += time.Since(w) }()
	// The new pages stay where the checkpoint wrote them and the shared
	// ones are punched out: no copy, and pages dropped from the page cache
	// before writeback are never written to disk.
	if content, err := punchShared(fd, size, pages, pl.newPages); err == nil {
		chunk := chunkName(content)
		return named(size, pl.extents, chunk), newChunk{name: chunk, tmp: p}, pages, nil
	} else if !errors.Is(err, unix.EOPNOTSUPP) {
		return File{}, newChunk{}, nil, err
	}
	// A file system without hole punching: copy the new pages out.
	pl = planFile(size, pages, b.pages, false)
	newPages := make([][32]byte, len(pl.newPages))
	for i, pi := range pl.newPages {
		newPages[i] = pages[pi]
	}
	tmp := p + ".chunk"
	if err := writePages(tmp, data, pl.newPages); err != nil {
		return File{}, newChunk{}, nil, err
	}
	chunk := chunkName(newPages)
	return named(size, pl.extents, chunk), newChunk{name: chunk, tmp: tmp}, pages, nil
}

// named fills the new chunk's name into a plan's extents.
func named(size int64, extents []Extent, chunk string) File {
	for i := range extents {
		if extents[i].Chunk == "" {
			extents[i].Chunk = chunk
		}
	}
	return File{Size: size, Extents: extents}
}

// punchShared turns the file into a sparse chunk holding only its new
// pages (the others read as zeros) and returns the page hashes of what it
// now holds.
func punchShared(fd *os.File, size int64, pages [][32]byte, newPages []int) ([][32]byte, error) {
	content := slices.Clone(pages)
	for _, r := range sharedRuns(size, len(pages), newPages) {
		err := unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r[0], r[1])
		if err != nil {
			return nil, err
		}
		for i := r[0] / PageSize; i*PageSize < r[0]+r[1]; i++ {
			content[i] = zeroHash(min(PageSize, size-i*PageSize))
		}
	}
	return content, nil
}

// writePages writes the given pages of data, in order, to a new file,
// one write per run of consecutive pages.
func writePages(p string, data []byte, idx []int) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for i := 0; i < len(idx); {
		j := i + 1
		for j < len(idx) && idx[j] == idx[j-1]+1 {
			j++
		}
		from, to := idx[i]*PageSize, min(idx[j-1]*PageSize+PageSize, len(data))
		if _, err := f.Write(data[from:to]); err != nil {
			return err
		}
		i = j
	}
	return f.Close()
}

// bases are the pages an Add may reference, with their chunks pinned so
// that a concurrent delete cannot remove them before the new snapshot
// holds them.
type bases struct {
	pages     map[[32]byte]loc
	chunks    map[string]bool
	took      time.Duration
	writeTook time.Duration
}

// maxBases bounds how many of a sandbox's snapshots a new one dedupes
// against (each costs reading its page index and a map insert per page).
// Measured on the chain test: the last 3 stored as much as the last one
// (16.7–16.9 MiB against 16.7–17.1 over 10 snapshots).
const maxBases = 1

// pinBases picks what a new snapshot of sn.Sandbox dedupes against: the
// sandbox's latest snapshots and the one it was restored from.
func (s *Store) pinBases(sn Snapshot) *bases {
	start := time.Now()
	b := &bases{pages: map[[32]byte]loc{}, chunks: map[string]bool{}}
	if sn.Internal {
		return b
	}
	s.mu.Lock()
	var picked []*Snapshot
	for _, o := range s.snaps {
		if o.Internal || sn.Sandbox == "" || o.Sandbox != sn.Sandbox {
			continue
		}
		picked = append(picked, o)
	}
	sort.Slice(picked, func(i, j int) bool { return picked[i].CreatedAt.After(picked[j].CreatedAt) })
	picked = picked[:min(len(picked), maxBases)]
	if p, ok := s.snaps[sn.Parent]; ok && !p.Internal && !slices.Contains(picked, p) {
		picked = append(picked, p)
	}
	copies := make([]Snapshot, len(picked))
	for i, p := range picked {
		copies[i] = *p
		for c := range p.chunks() {
			if !b.chunks[c] { // snapshots share chunks: pin each once
				b.chunks[c] = true
				s.pins[c]++
			}
		}
	}
	s.mu.Unlock()
	for _, p := range copies {
		for name, f := range p.Files {
			pages, err := s.readIndex(p.ID, name)
			if err != nil {
				// Copied from a peer or stored before chunks: hash it now,
				// once (its chunks are pinned).
				if pages, err = s.indexFile(p.ID, name, f); err != nil {
					continue // nothing to share with it
				}
			}
			locations(b.pages, f, pages)
		}
	}
	b.took = time.Since(start)
	return b
}

func (s *Store) unpin(chunks map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range chunks {
		s.pins[c]--
		s.dropIfUnusedLocked(c)
	}
}

// commit puts the new chunks in place and records sn, under the lock so
// that no delete runs between a chunk being found present and referenced.
// A snapshot the store holds is never replaced.
// commit puts snapshot sn in the store; with hold, held as holdLocked
// holds it (release returned), in the same lock as its arrival.
func (s *Store) commit(sn *Snapshot, fresh []newChunk, hold bool) (release func(), err error) {
	if err := ValidID(sn.ID); err != nil { // it names the metadata's file
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snaps[sn.ID]; ok {
		return nil, errdefs.Conflict("snapshot %s is already stored on this node: not replaced", sn.ID)
	}
	defer func() {
		if err != nil { // what this snapshot put in place and nothing uses
			for _, c := range fresh {
				s.dropIfUnusedLocked(c.name)
			}
		}
	}()
	for _, c := range fresh {
		if s.chunkRefs[c.name] > 0 || s.pins[c.name] > 0 {
			os.Remove(c.tmp) // already stored: shared
			continue
		}
		if err := os.Rename(c.tmp, s.chunk(c.name)); err != nil {
			return nil, err
		}
	}
	for c := range sn.chunks() {
		st, err := os.Stat(s.chunk(c))
		if err != nil {
			return nil, fmt.Errorf("chunk %s of snapshot %s: %w", c, sn.ID, err)
		}
		if s.chunkRefs[c] == 0 && s.pins[c] == 0 {
			sn.Stored += diskSize(st)
		}
		s.chunkSize[c] = diskSize(st)
	}
	if err := s.writeMeta(*sn); err != nil {
		return nil, err
	}
	for c := range sn.chunks() {
		s.chunkRefs[c]++
	}
	c := *sn
	s.snaps[sn.ID] = &c
	if hold {
		release = s.holdLocked(sn.ID)
	}
	return release, nil
}

// writeIndex saves the page hashes of a snapshot's files.
func (s *Store) writeIndex(id string, files map[string][][32]byte) error {
	if len(files) == 0 {
		return nil
	}
	dir := filepath.Join(s.dir, "index", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, pages := range files {
		var raw []byte
		if len(pages) > 0 {
			raw = unsafe.Slice((*byte)(unsafe.Pointer(&pages[0])), len(pages)*32)
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// indexFile hashes the pages of a stored file, extent by extent, and saves
// them as its index.
func (s *Store) indexFile(id, name string, f File) ([][32]byte, error) {
	var pages [][32]byte
	for _, e := range f.Extents {
		if compressed(e.Chunk) {
			return nil, fmt.Errorf("file %s is stored compressed", name)
		}
		m, err := mapChunk(s.chunk(e.Chunk))
		if err != nil {
			return nil, err
		}
		if e.Off+e.Len > int64(len(m)) {
			unix.Munmap(m)
			return nil, fmt.Errorf("chunk %s is shorter than its extent", e.Chunk)
		}
		pages = append(pages, pageHashes(m[e.Off:e.Off+e.Len])...)
		if len(m) > 0 {
			unix.Munmap(m)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.snaps[id]; live { // a deleted snapshot's index would be left behind
		s.writeIndex(id, map[string][][32]byte{name: pages})
	}
	return pages, nil
}

func (s *Store) readIndex(id, name string) ([][32]byte, error) {
	raw, err := os.ReadFile(filepath.Join(s.dir, "index", id, name))
	if err != nil {
		return nil, err
	}
	pages := make([][32]byte, len(raw)/32)
	for i := range pages {
		copy(pages[i][:], raw[i*32:])
	}
	return pages, nil
}
