package envd

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/envdapi"
)

// A pause without memory (docs/design.md, "Lifecycle") keeps only a
// sandbox's files: the host asks envd for the files changed since the boot
// and later hands them to the envd of a fresh boot of the template. envd
// walks, archives and extracts them itself: no tool of the sandbox's
// filesystem (its /bin/sh, tar, find, which the sandbox may have replaced)
// works for the host, and nothing is staged inside the sandbox (an archive
// in /dev/shm counted against its memory and got it killed).

// ChangesPath is the route of a sandbox's changed files
// (envdapi.ChangesPath): GET ?since=<Unix nanoseconds> answers the archive
// (a tar stream, below), POST with such an archive as body puts the files
// back.
const ChangesPath = envdapi.ChangesPath

// The archive holds, parents before children, every directory, regular
// file, symlink and FIFO of the root filesystem whose ctime is after since
// (a second name of a file is a hard link to the first, a symlink is kept
// as a link), then the entry changesList: the NUL-terminated names of every
// entry walked, so the restore deletes what the sandbox no longer had.
// Names are relative to / ("etc/hosts"); times are kept to the second.
const changesList = reserved + "/paths"

// reserved is agentenv's directory in every template (envd's binary): it
// is neither saved nor restored, so each boot runs the template's envd, and
// no file of the sandbox can take the path list's name.
const reserved = ".agentenv"

// tree is the filesystem the changes routes walk: the sandbox's root, or a
// test's directory.
type tree struct {
	root string
	fd   int
	// mounts are the mount points below root, relative to it.
	mounts map[string]mountPoint
	// parent caches the directory of the last entry extracted.
	parent struct {
		rel string
		fd  int
	}
	// touched holds, while a restore writes, the mtime each directory it
	// writes into had before: a file replaced in /etc leaves /etc's time
	// as the paused sandbox had it (unchanged, so not in the archive).
	touched map[string]unix.Timespec
}

type mountPoint struct {
	fstype string
	ro     bool
}

func openTree(root string) (*tree, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	t := &tree{root: root, fd: fd}
	t.parent.fd = -1
	if t.mounts, err = mountsUnder(root); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *tree) close() {
	t.forgetParent()
	unix.Close(t.fd)
}

// mountsUnder reads /proc/self/mountinfo: the mount points strictly below
// root, relative to it.
func mountsUnder(root string) (map[string]mountPoint, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	prefix := strings.TrimSuffix(root, "/") + "/"
	out := map[string]mountPoint{}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 6 || sep < 6 || sep+1 >= len(f) {
			continue
		}
		mp := unescapeMount(f[4])
		rel, ok := strings.CutPrefix(mp, prefix)
		if !ok || rel == "" {
			continue
		}
		out[rel] = mountPoint{fstype: f[sep+1], ro: slices.Contains(strings.Split(f[5], ","), "ro")}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// walked reports whether the walk enters the mount at rel: only a writable
// tmpfs on /tmp (gVisor's /tmp when the write layer is in memory; on E2B
// /tmp is on the disk). /proc, /sys, /dev, /dev/shm, the read-only anchor
// in /tmp and any other bind are not the sandbox's disk.
func (m mountPoint) walked(rel string) bool {
	return rel == "tmp" && m.fstype == "tmpfs" && !m.ro
}

type visitFunc func(dirfd int, name, rel string, st *unix.Stat_t) error

// walk calls fn for every entry of the tree's filesystem, parents before
// children, names in order, without following symlinks and without entering
// other filesystems (see walked) or agentenv's directory.
func (t *tree) walk(fn visitFunc) error {
	var st unix.Stat_t
	if err := unix.Fstat(t.fd, &st); err != nil {
		return err
	}
	fd, err := unix.Dup(t.fd)
	if err != nil {
		return err
	}
	return t.walkDir(fd, "", st.Dev, fn)
}

func (t *tree) walkDir(fd int, rel string, dev uint64, fn visitFunc) error {
	dir := os.NewFile(uintptr(fd), "/"+rel)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		crel := path.Join(rel, name)
		if crel == reserved {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed meanwhile
			}
			return &os.PathError{Op: "lstat", Path: "/" + crel, Err: err}
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		cdev := dev
		if m, ok := t.mounts[crel]; ok {
			if !m.walked(crel) {
				continue
			}
			cdev = st.Dev
		} else if isDir && st.Dev != dev {
			// Another filesystem that mountinfo did not name. (gVisor's
			// overlay gives every directory its own device number; files
			// keep their layer's, so only directories are compared.)
			continue
		}
		if err := fn(fd, name, crel, &st); err != nil {
			return err
		}
		if !isDir {
			continue
		}
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if gone(err) {
				continue // removed or replaced meanwhile
			}
			return &os.PathError{Op: "open", Path: "/" + crel, Err: err}
		}
		if err := t.walkDir(cfd, crel, cdev, fn); err != nil {
			return err
		}
	}
	return nil
}

// gone reports an error of opening a path that is no longer what the walk
// saw there: removed, or replaced by a link or a file.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)
}

// save writes the archive of the entries changed after since to w.
func (t *tree) save(w io.Writer, since time.Time) error {
	tw := tar.NewWriter(w)
	var list []byte
	links := map[[2]uint64]string{}
	err := t.walk(func(dirfd int, name, rel string, st *unix.Stat_t) error {
		list = append(append(list, rel...), 0)
		if !time.Unix(st.Ctim.Unix()).After(since) {
			return nil
		}
		return saveEntry(tw, dirfd, name, rel, st, links)
	})
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: changesList, Mode: 0o600, Size: int64(len(list))}); err != nil {
		return err
	}
	if _, err := tw.Write(list); err != nil {
		return err
	}
	return tw.Close()
}

func header(rel string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name: rel, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
	}
}

func saveEntry(tw *tar.Writer, dirfd int, name, rel string, st *unix.Stat_t, links map[[2]uint64]string) error {
	h := header(rel, st)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if gone(err) {
				return nil
			}
			return &os.PathError{Op: "open", Path: "/" + rel, Err: err}
		}
		h.PAXRecords, err = userXattrs(fd)
		unix.Close(fd)
		if err != nil {
			return &os.PathError{Op: "listxattr", Path: "/" + rel, Err: err}
		}
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name)
		if err != nil {
			if gone(err) || errors.Is(err, unix.EINVAL) {
				return nil
			}
			return &os.PathError{Op: "readlink", Path: "/" + rel, Err: err}
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := links[key]; ok && st.Nlink > 1 {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			break
		}
		if err := saveFile(tw, dirfd, name, rel, h); err != nil || h.Typeflag != tar.TypeReg {
			return err
		}
		if st.Nlink > 1 {
			links[key] = rel
		}
		return nil
	default:
		return nil // sockets and devices are not the sandbox's files
	}
	return tw.WriteHeader(h)
}

// saveFile writes a regular file's entry from the descriptor it opens
// (without following a link, nor waiting on a FIFO put in its place): its
// size, mode and owner as the descriptor has them. A file that shrinks while
// it is read is padded with zeros, one that grows is cut, so the stream stays
// whole. It leaves h.Typeflag unset when the file went away.
func saveFile(tw *tar.Writer, dirfd int, name, rel string, h *tar.Header) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if gone(err) {
			return nil
		}
		return &os.PathError{Op: "open", Path: "/" + rel, Err: err}
	}
	f := os.NewFile(uintptr(fd), "/"+rel)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: "/" + rel, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	*h = *header(rel, &st)
	h.Typeflag, h.Size = tar.TypeReg, st.Size
	if h.PAXRecords, err = userXattrs(fd); err != nil {
		return &os.PathError{Op: "listxattr", Path: "/" + rel, Err: err}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// A read error ends the file early (padded below); an error of
	// io.Copy is then the stream's.
	fr := &fileReader{r: io.LimitReader(f, st.Size)}
	n, err := io.Copy(tw, fr)
	if err != nil {
		return err
	}
	_, err = io.CopyN(tw, zeros{}, st.Size-n)
	return err
}

// fileReader reads a file being archived, any read error as its end.
type fileReader struct{ r io.Reader }

func (r *fileReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = io.EOF
	}
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// xattrPAX is how tar keeps an extended attribute (GNU tar, bsdtar).
const xattrPAX = "SCHILY.xattr."

// userXattrs returns the user.* extended attributes of fd (E2B's file
// metadata among them) as PAX records; nil if none or unsupported.
func userXattrs(fd int) (map[string]string, error) {
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		if xattrUnsupported(err) {
			return nil, nil
		}
		return nil, err
	}
	var out map[string]string
	for _, name := range names {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v, err := fgetxattr(fd, name)
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[xattrPAX+name] = string(v)
	}
	return out, nil
}

func fgetxattr(fd int, name string) ([]byte, error) {
	for tries := 0; tries < 4; tries++ {
		size, err := unix.Fgetxattr(fd, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, size)
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue // it grew meanwhile
		}
		return buf[:n], err
	}
	return nil, unix.ERANGE
}

// countWriter counts the bytes that reached the response.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// getChanges answers the archive of the files changed after ?since. A
// failure once the stream has begun aborts it, so the host never takes a
// short archive for a whole one.
func (s *Server) getChanges(w http.ResponseWriter, r *http.Request) {
	ns, err := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "since must be a time in Unix nanoseconds: "+err.Error())
		return
	}
	t, err := openTree(s.changesRoot)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "save the changed files: "+err.Error())
		return
	}
	defer t.close()
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, 64<<10)
	err = t.save(bw, time.Unix(0, ns))
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		if cw.n == 0 {
			writeError(w, http.StatusInternalServerError, "save the changed files: "+err.Error())
			return
		}
		panic(http.ErrAbortHandler)
	}
}

// postChanges puts the files of an archive back (see restore).
func (s *Server) postChanges(w http.ResponseWriter, r *http.Request) {
	t, err := openTree(s.changesRoot)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "restore the files: "+err.Error())
		return
	}
	defer t.close()
	if err := t.restore(bufio.NewReaderSize(r.Body, 64<<10)); err != nil {
		status := http.StatusInternalServerError
		var ae *archiveError
		switch {
		case errors.As(err, &ae):
			status = http.StatusBadRequest
		case errors.Is(err, unix.ENOSPC):
			status = http.StatusInsufficientStorage
		}
		// The host is still sending: read on (within reason), or it may
		// see a broken connection instead of this answer.
		io.Copy(io.Discard, io.LimitReader(r.Body, 256<<20))
		writeError(w, status, "restore the files: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// archiveError is a fault of the archive itself (not of the filesystem).
type archiveError struct{ msg string }

func (e *archiveError) Error() string { return e.msg }

func badArchive(format string, args ...any) error {
	return &archiveError{msg: fmt.Sprintf(format, args...)}
}
