package snapshot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Acquire marks the snapshot as used by one more sandbox and returns a
// directory laid out as the runtime wrote it, a function that removes that
// directory once the restore is done, and a function that releases the use
// (call it when the sandbox ends). A file stored whole is a hard link to
// its chunk; one stored as extents is put together once and shared by the
// restores that overlap (see assembly).
func (s *Store) Acquire(id string) (dir string, done func(), release func(), err error) {
	s.mu.Lock()
	sn, ok := s.snaps[id]
	if !ok {
		s.mu.Unlock()
		return "", nil, nil, errdefs.NotFound("snapshot %q does not exist (list them with GET /snapshots)", id)
	}
	files := sn.Files
	release = s.holdLocked(id)
	asm := s.asm[id]
	if asm == nil {
		asm = &assembly{}
		s.asm[id] = asm
	}
	s.mu.Unlock()
	if err := asm.build(s, files); err != nil {
		s.mu.Lock()
		if s.asm[id] == asm {
			delete(s.asm, id) // the next restore tries again
		}
		s.mu.Unlock()
		asm.remove() // what it put together before failing
		release()
		return "", nil, nil, fmt.Errorf("restore snapshot %s: %w", id, err)
	}
	dir, err = os.MkdirTemp(filepath.Join(s.dir, "tmp"), "restore-")
	if err != nil {
		release()
		return "", nil, nil, err
	}
	for name, f := range files {
		switch src := asm.path(name); {
		case len(f.Extents) == 0:
			err = os.WriteFile(filepath.Join(dir, name), nil, 0o600)
		case src != "":
			err = os.Link(src, filepath.Join(dir, name))
		default:
			err = os.Link(s.chunk(f.Extents[0].Chunk), filepath.Join(dir, name))
		}
		if err != nil {
			os.RemoveAll(dir)
			release()
			return "", nil, nil, fmt.Errorf("restore snapshot %s file %s: %w", id, name, err)
		}
	}
	return dir, func() { os.RemoveAll(dir) }, release, nil
}

// holdLocked counts one more use of a snapshot and returns its release;
// the last release drops the snapshot's assembled files.
func (s *Store) holdLocked(id string) func() { return s.refs.Hold(id) }

// lastReleasedLocked drops a snapshot's assembled files once no sandbox
// uses it.
func (s *Store) lastReleasedLocked(id string) {
	if asm := s.asm[id]; asm != nil {
		delete(s.asm, id)
		asm.remove()
	}
}

// assembly holds a snapshot's files that are stored as extents, put
// together once while sandboxes restore from it: a restore needs whole
// files, and writing tens of MiB per restore would cost more than the
// restore itself. It goes when the last sandbox using it ends, so idle
// snapshots cost only their chunks.
type assembly struct {
	once  sync.Once
	err   error
	dir   string
	files map[string]bool
}

func (a *assembly) build(s *Store, files map[string]File) error {
	a.once.Do(func() {
		a.files = map[string]bool{}
		for name, f := range files {
			if s.whole(f) {
				continue
			}
			if a.dir == "" {
				if a.dir, a.err = os.MkdirTemp(filepath.Join(s.dir, "tmp"), "assembled-"); a.err != nil {
					return
				}
			}
			if a.err = s.assemble(filepath.Join(a.dir, name), f); a.err != nil {
				a.err = fmt.Errorf("file %s: %w", name, a.err)
				return
			}
			a.files[name] = true
		}
	})
	return a.err
}

// path is where the assembled file name is ("" if it is stored whole).
func (a *assembly) path(name string) string {
	if !a.files[name] {
		return ""
	}
	return filepath.Join(a.dir, name)
}

func (a *assembly) remove() {
	if a.dir != "" {
		os.RemoveAll(a.dir)
	}
}

// whole reports whether one whole chunk is file f (or f is empty).
func (s *Store) whole(f File) bool {
	if len(f.Extents) == 0 {
		return true
	}
	if len(f.Extents) > 1 || f.Extents[0].Off != 0 || compressed(f.Extents[0].Chunk) {
		return false
	}
	st, err := os.Stat(s.chunk(f.Extents[0].Chunk))
	return err == nil && st.Size() == f.Size
}

// assemble writes file f at dst, its extents gathered from the mapped
// chunks, a thousand per
// write (a snapshot's pages file has thousands of extents when its
// sandbox changed many scattered pages: one syscall per extent would cost
// more than the copy).
func (s *Store) assemble(dst string, f File) error {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if len(f.Extents) == 1 && compressed(f.Extents[0].Chunk) {
		if err := inflate(out, s.chunk(f.Extents[0].Chunk), f.Size); err != nil {
			return err
		}
		return out.Close()
	}
	mapped := map[string][]byte{}
	defer func() {
		for _, m := range mapped {
			unix.Munmap(m)
		}
	}()
	iovs := make([][]byte, 0, 1024)
	for i, e := range f.Extents {
		m, ok := mapped[e.Chunk]
		if !ok {
			if m, err = mapChunk(s.chunk(e.Chunk)); err != nil {
				return err
			}
			mapped[e.Chunk] = m
		}
		if e.Off+e.Len > int64(len(m)) {
			return fmt.Errorf("chunk %s holds %d bytes, an extent wants %d at %d", e.Chunk, len(m), e.Len, e.Off)
		}
		iovs = append(iovs, m[e.Off:e.Off+e.Len])
		if len(iovs) == cap(iovs) || i == len(f.Extents)-1 {
			if err := writeAll(int(out.Fd()), iovs); err != nil {
				return err
			}
			iovs = iovs[:0]
		}
	}
	return out.Close()
}

func mapChunk(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return []byte{}, err
	}
	return unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
}

// writeAll writes every byte of iovs, resuming after a short write.
func writeAll(fd int, iovs [][]byte) error {
	for len(iovs) > 0 {
		n, err := unix.Writev(fd, iovs)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		for n > 0 && len(iovs) > 0 {
			if n >= len(iovs[0]) {
				n -= len(iovs[0])
				iovs = iovs[1:]
			} else {
				iovs[0] = iovs[0][n:]
				n = 0
			}
		}
		for len(iovs) > 0 && len(iovs[0]) == 0 {
			iovs = iovs[1:]
		}
	}
	return nil
}

// Hold marks a snapshot as used by a sandbox adopted after a restart.
func (s *Store) Hold(id string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdLocked(id)
}
