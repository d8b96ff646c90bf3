package envd

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// restore puts the files of an archive (see ChangesPath) over the tree, a
// fresh boot of the template: it extracts every entry, replacing what is at
// its name, then deletes what the tree had and the archive's path list
// lacks, then sets the directories' times. Names are resolved one directory
// at a time without following links (a link in the tree, or one the archive
// made, is never gone through), absolute names and ".." are refused, and
// nothing is written into another filesystem or agentenv's directory.
func (t *tree) restore(r io.Reader) error {
	var fresh []string
	if err := t.walk(func(_ int, _, rel string, _ *unix.Stat_t) error {
		fresh = append(fresh, rel)
		return nil
	}); err != nil {
		return err
	}
	t.touched = map[string]unix.Timespec{}
	tr := tar.NewReader(r)
	var kept map[string]bool
	files := map[string]bool{} // regular files extracted: what a hard link may name
	type dirTime struct {
		rel   string
		mtime time.Time
	}
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return badArchive("read the archive: %v", err)
		}
		if kept != nil {
			return badArchive("entry %q after the path list: the path list must come last", h.Name)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == changesList {
			if kept, err = readList(tr); err != nil {
				return err
			}
			continue
		}
		if err := checkName(name); err != nil {
			return err
		}
		if !t.writable(name) {
			continue // the fresh boot has another filesystem there
		}
		if err := t.extract(tr, h, name, files); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{name, h.ModTime})
		}
	}
	if kept == nil {
		return badArchive("the archive has no path list (%s): it is incomplete", changesList)
	}
	// Children come after their parent in the walk: backwards, a
	// directory is empty by the time it is removed.
	for i := len(fresh) - 1; i >= 0; i-- {
		if !kept[fresh[i]] {
			if err := t.removePath(fresh[i]); err != nil {
				return err
			}
		}
	}
	t.forgetParent()
	if err := t.putBackTouched(); err != nil {
		return err
	}
	for _, d := range dirs {
		if err := t.atParent(d.rel, func(pfd int, base string) error {
			return setTimes(pfd, base, d.mtime)
		}); err != nil && !gone(err) {
			return &os.PathError{Op: "set times of", Path: "/" + d.rel, Err: err}
		}
	}
	return nil
}

func readList(r io.Reader) (map[string]bool, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, badArchive("read the path list: %v", err)
	}
	kept := map[string]bool{}
	for _, p := range strings.Split(string(b), "\x00") {
		if p != "" {
			kept[p] = true
		}
	}
	return kept, nil
}

// checkName refuses a name that is not a clean relative path, or that is
// agentenv's.
func checkName(name string) error {
	if name == "" || name == "." || path.IsAbs(name) || path.Clean(name) != name ||
		name == ".." || strings.HasPrefix(name, "../") {
		return badArchive("entry %q: names must be relative, clean and stay inside /", name)
	}
	if name == reserved || strings.HasPrefix(name, reserved+"/") {
		return badArchive("entry %q: /%s is agentenv's", name, reserved)
	}
	return nil
}

// writable reports whether name is on the filesystem the walk covers (not
// inside or on another mount).
func (t *tree) writable(name string) bool {
	for p := name; p != "."; p = path.Dir(p) {
		if m, ok := t.mounts[p]; ok && !m.walked(p) {
			return false
		}
	}
	return true
}

// extract makes the entry h at name, replacing what is there.
func (t *tree) extract(tr *tar.Reader, h *tar.Header, name string, files map[string]bool) error {
	err := t.atParent(name, func(pfd int, base string) error {
		switch h.Typeflag {
		case tar.TypeDir:
			return makeDir(pfd, base, h)
		case tar.TypeReg, tar.TypeRegA:
			if err := removeAt(pfd, base); err != nil {
				return err
			}
			if err := makeFile(pfd, base, h, tr); err != nil {
				return err
			}
			files[name] = true
			return nil
		case tar.TypeSymlink:
			if err := removeAt(pfd, base); err != nil {
				return err
			}
			if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
				return err
			}
			if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			return setTimes(pfd, base, h.ModTime)
		case tar.TypeLink:
			if !files[h.Linkname] {
				return badArchive("entry %q: a hard link to %q, which the archive has not made before", name, h.Linkname)
			}
			if err := removeAt(pfd, base); err != nil {
				return err
			}
			// The target's directory, opened the same careful way.
			return t.atOther(h.Linkname, func(tfd int, tbase string) error {
				return unix.Linkat(tfd, tbase, pfd, base, 0)
			})
		case tar.TypeFifo:
			if err := removeAt(pfd, base); err != nil {
				return err
			}
			if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
				return err
			}
			if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			// Nothing else runs in the fresh boot: the FIFO just made is
			// still the one chmod finds.
			if err := unix.Fchmodat(pfd, base, uint32(h.Mode&0o7777), 0); err != nil {
				return err
			}
			return setTimes(pfd, base, h.ModTime)
		}
		return nil // what save never writes: skipped
	})
	var ae *archiveError
	if err != nil && !errors.As(err, &ae) {
		return &os.PathError{Op: "restore", Path: "/" + name, Err: err}
	}
	return err
}

// makeDir makes (or keeps) the directory base and gives it h's owner, mode
// and extended attributes; its times are set once its entries are in.
func makeDir(pfd int, base string, h *tar.Header) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := removeAt(pfd, base); err != nil {
			return err
		}
	}
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return err
		}
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return setAttrs(fd, h)
}

func makeFile(pfd int, base string, h *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if _, err := io.Copy(f, r); err != nil {
		return err
	}
	if err := setAttrs(fd, h); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return setTimes(pfd, base, h.ModTime)
}

// setAttrs gives fd h's owner, then mode (a chown clears set-id bits) and
// user.* extended attributes.
func setAttrs(fd int, h *tar.Header) error {
	if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(h.Mode&0o7777)); err != nil {
		return err
	}
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAX)
		if !ok || !strings.HasPrefix(name, "user.") {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil && !xattrUnsupported(err) {
			return err
		}
	}
	return nil
}

func setTimes(pfd int, base string, mtime time.Time) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(mtime.UnixNano())}
	return unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// removePath removes rel and all it holds; a path whose directory is gone
// or is no longer a directory is already removed.
func (t *tree) removePath(rel string) error {
	err := t.atParent(rel, removeAt)
	if err != nil && !gone(err) {
		return &os.PathError{Op: "remove", Path: "/" + rel, Err: err}
	}
	return nil
}

// removeAt removes what is at base in the directory pfd, without following
// links; a directory is emptied first. Nothing there is not an error.
func removeAt(pfd int, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, oerr := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if oerr != nil {
		return err
	}
	dir := os.NewFile(uintptr(fd), base)
	names, rerr := dir.Readdirnames(-1)
	for _, n := range names {
		if rerr == nil {
			rerr = removeAt(fd, n)
		}
	}
	dir.Close()
	if rerr != nil {
		return rerr
	}
	if err := unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// atParent calls fn with the directory that holds rel, opened from the
// tree's root one name at a time without following links, and rel's last
// name. The last directory opened is kept for the next entry, which is
// usually its sibling (fn removes at most base, never that directory).
func (t *tree) atParent(rel string, fn func(pfd int, base string) error) error {
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if t.parent.fd < 0 || t.parent.rel != dir {
		fd, err := t.openDir(dir)
		if err != nil {
			return err
		}
		t.forgetParent()
		t.parent.rel, t.parent.fd = dir, fd
		if _, seen := t.touched[dir]; t.touched != nil && !seen {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return err
			}
			t.touched[dir] = st.Mtim
		}
	}
	return fn(t.parent.fd, base)
}

// putBackTouched gives every directory the restore wrote into the mtime
// it had before, and stops recording; the archive's own directories get
// theirs after this.
func (t *tree) putBackTouched() error {
	touched := t.touched
	t.touched = nil
	for rel, mtime := range touched {
		fd, err := t.openDir(rel)
		if gone(err) {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "open", Path: "/" + rel, Err: err}
		}
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, mtime}
		err = unix.UtimesNanoAt(fd, ".", ts, 0)
		unix.Close(fd)
		if err != nil {
			return &os.PathError{Op: "set times of", Path: "/" + rel, Err: err}
		}
	}
	return nil
}

// atOther is atParent without the cache (used while atParent's directory
// is in use).
func (t *tree) atOther(rel string, fn func(pfd int, base string) error) error {
	dir, base := path.Split(rel)
	fd, err := t.openDir(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd, base)
}

func (t *tree) forgetParent() {
	if t.parent.fd >= 0 {
		unix.Close(t.parent.fd)
		t.parent.fd, t.parent.rel = -1, ""
	}
}

// openDir opens the directory rel ("" for the root) one name at a time,
// refusing links (ELOOP) and non-directories (ENOTDIR) on the way.
func (t *tree) openDir(rel string) (int, error) {
	fd, err := unix.Dup(t.fd)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return fd, nil
	}
	for _, name := range strings.Split(rel, "/") {
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}
