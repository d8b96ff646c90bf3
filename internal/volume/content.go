package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// Entry describes one file or directory of a volume, as E2B's content
// API answers (VolumeEntryStat).
type Entry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // file, directory, symlink, unknown
	Path   string    `json:"path"` // absolute, inside the volume
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"` // permission bits
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// Owner and mode of what the content API makes when the caller names
// none: anyone in a sandbox may read and write it, as on E2B.
const (
	DefaultFileMode = 0o666
	DefaultDirMode  = 0o777
)

// Attrs are the optional owner and mode a write, mkdir or metadata update
// sets.
type Attrs struct {
	UID, GID *uint32
	Mode     *uint32
}

// clean turns a path as the API receives it (absolute or relative to the
// volume's top) into the absolute path inside the volume and the name
// relative to its root ("." for the top).
func clean(p string) (abs, rel string, err error) {
	if p == "" {
		return "", "", errdefs.Invalid("path is empty: give a path inside the volume, such as /data/file.txt")
	}
	abs = path.Clean("/" + p)
	rel = strings.TrimPrefix(abs, "/")
	if rel == "" {
		rel = "."
	}
	return abs, rel, nil
}

// at opens volume id's root and cleans p in it.
func (s *Store) at(id, p string) (r *os.Root, abs, rel string, err error) {
	if r, err = s.root(id); err == nil {
		abs, rel, err = clean(p)
	}
	return r, abs, rel, err
}

// pathErr maps a file-system error on p to the API's classes.
func pathErr(abs string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("path %s not found", abs)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Conflict("path %s already exists: pass force=true to replace it", abs)
	case errors.Is(err, syscall.ENOTDIR):
		return errdefs.Invalid("a component of path %s is a file, not a directory", abs)
	case errors.Is(err, syscall.EISDIR):
		return errdefs.Invalid("path %s is a directory", abs)
	case errors.Is(err, syscall.ENOTEMPTY):
		return errdefs.Conflict("directory %s is not empty", abs)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return errdefs.InsufficientStorage("the volume is full writing %s: remove files from it (its size is the server's --volume-size-mb when it was created)", abs)
	}
	var errno syscall.Errno
	var pe *fs.PathError
	if !errors.As(err, &errno) && errors.As(err, &pe) {
		// Not the file system's error but os.Root's refusal: a symbolic
		// link or ".." leading outside the volume (it has no exported
		// error value).
		return errdefs.Invalid("path %s leads outside the volume: %v", abs, pe.Err)
	}
	return err
}

// Stat describes the entry at p.
func (s *Store) Stat(id, p string) (Entry, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	return stat(r, abs, rel)
}

func stat(r *os.Root, abs, rel string) (Entry, error) {
	fi, err := r.Lstat(rel)
	if err != nil {
		return Entry{}, pathErr(abs, err)
	}
	e := entry(abs, fi)
	if e.Type == "symlink" {
		e.Target, _ = r.Readlink(rel)
	}
	return e, nil
}

func entry(abs string, fi fs.FileInfo) Entry {
	e := Entry{Name: path.Base(abs), Path: abs, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Mtime: fi.ModTime().UTC()}
	if abs == "/" {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
	default:
		e.Type = "unknown"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Unix()).UTC()
		e.Ctime = time.Unix(st.Ctim.Unix()).UTC()
	}
	return e
}

// ListDir describes the entries under directory p, down to depth levels
// (1: its children only).
func (s *Store) ListDir(id, p string, depth int) ([]Entry, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return nil, err
	}
	if depth < 1 {
		depth = 1
	}
	top, err := stat(r, abs, rel)
	if err != nil {
		return nil, err
	}
	if top.Type != "directory" {
		return nil, errdefs.Invalid("path %s is not a directory", abs)
	}
	out := []Entry{}
	var walk func(abs, rel string, level int) error
	walk = func(abs, rel string, level int) error {
		f, err := r.Open(rel)
		if err != nil {
			return pathErr(abs, err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return pathErr(abs, err)
		}
		for _, n := range names {
			cabs, crel := path.Join(abs, n), path.Join(rel, n)
			e, err := stat(r, cabs, crel)
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, e)
			if e.Type == "directory" && level < depth {
				if err := walk(cabs, crel, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(abs, rel, 1)
}

// MakeDir makes directory p. Without force an existing p is a conflict
// and a missing parent is not found; with force it makes the parents too
// and an existing directory is fine.
func (s *Store) MakeDir(id, p string, a Attrs, force bool) (Entry, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	mode := fs.FileMode(DefaultDirMode)
	if a.Mode != nil {
		mode = fs.FileMode(*a.Mode).Perm()
	}
	if force {
		err = mkdirAll(r, abs, rel, mode)
	} else {
		err = r.Mkdir(rel, mode)
	}
	if err != nil {
		return Entry{}, pathErr(abs, err)
	}
	if err := setAttrs(r, rel, a, mode); err != nil {
		return Entry{}, pathErr(abs, err)
	}
	return stat(r, abs, rel)
}

// mkdirAll makes directory rel and its parents; a file in the way is the
// caller's error.
func mkdirAll(r *os.Root, abs, rel string, mode fs.FileMode) error {
	err := r.MkdirAll(rel, mode)
	if errors.Is(err, fs.ErrExist) {
		return errdefs.Invalid("a component of path %s is a file, not a directory", abs)
	}
	return pathErr(abs, err)
}

// setAttrs applies a's owner and mode (mode also when a has none: the
// process umask must not narrow what E2B's defaults promise).
func setAttrs(r *os.Root, rel string, a Attrs, mode fs.FileMode) error {
	if a.Mode != nil {
		mode = fs.FileMode(*a.Mode).Perm()
	}
	if err := r.Chmod(rel, mode); err != nil {
		return err
	}
	if a.UID != nil || a.GID != nil {
		uid, gid := -1, -1
		if a.UID != nil {
			uid = int(*a.UID)
		}
		if a.GID != nil {
			gid = int(*a.GID)
		}
		return r.Lchown(rel, uid, gid)
	}
	return nil
}

// WriteFile writes body to file p. Without force an existing p is a
// conflict and a missing parent is not found; with force it makes the
// parents and replaces p.
func (s *Store) WriteFile(id, p string, body io.Reader, a Attrs, force bool) (Entry, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	if rel == "." {
		return Entry{}, errdefs.Invalid("path / is the volume's top directory, not a file")
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		if err := mkdirAll(r, abs, path.Dir(rel), DefaultDirMode); err != nil {
			return Entry{}, err
		}
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := r.OpenFile(rel, flags, DefaultFileMode)
	if err != nil {
		return Entry{}, pathErr(abs, err)
	}
	// Charged while it is written: a write the host's disk cannot take
	// stops at the chunk that does not fit.
	meter := s.cfg.Meter.Start(fmt.Sprintf("a write of %s to a volume", abs))
	defer meter.Close()
	_, err = io.Copy(diskmeter.Writer(f, meter), body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A file cut short (the volume full, the host's disk at its
		// reserve, the client gone) is removed rather than left looking
		// whole and holding the space.
		r.Remove(rel)
		if errors.Is(err, errdefs.ErrInsufficientStorage) {
			return Entry{}, err
		}
		return Entry{}, pathErr(abs, err)
	}
	if err := setAttrs(r, rel, a, DefaultFileMode); err != nil {
		return Entry{}, pathErr(abs, err)
	}
	return stat(r, abs, rel)
}

// ReadFile opens file p for reading.
func (s *Store) ReadFile(id, p string) (*os.File, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return nil, err
	}
	f, err := r.Open(rel)
	if err != nil {
		return nil, pathErr(abs, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, errdefs.Invalid("path %s is not a file", abs)
	}
	return f, nil
}

// UpdateMetadata sets p's owner and mode.
func (s *Store) UpdateMetadata(id, p string, a Attrs) (Entry, error) {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return Entry{}, err
	}
	cur, err := stat(r, abs, rel)
	if err != nil {
		return Entry{}, err
	}
	if err := setAttrs(r, rel, a, fs.FileMode(cur.Mode)); err != nil {
		return Entry{}, pathErr(abs, err)
	}
	return stat(r, abs, rel)
}

// Remove deletes p (a directory with everything under it).
func (s *Store) Remove(id, p string) error {
	r, abs, rel, err := s.at(id, p)
	if err != nil {
		return err
	}
	if rel == "." {
		return errdefs.Invalid("cannot delete the volume's top directory: delete the volume instead (DELETE /volumes/{id})")
	}
	if _, err := r.Lstat(rel); err != nil {
		return pathErr(abs, err)
	}
	return pathErr(abs, r.RemoveAll(rel))
}
