package template

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// ExtractTar unpacks a tar stream (plain or gzip) into the directory dst as
// root would, but never outside dst: every path is resolved inside dst
// (os.Root: symlinks cannot lead out), absolute names and ".." are refused,
// and device nodes and FIFOs are skipped (returned as skipped). At most
// maxBytes of file data are written (0: no limit). The stream comes from an
// API client: an error leaves a partial tree in dst for the caller to
// remove.
func ExtractTar(ctx context.Context, r io.Reader, dst string, maxBytes int64) (skipped int, err error) {
	return extractTar(ctx, r, dst, maxBytes, nil)
}

// ExtractTarCharged is ExtractTar without a byte limit of its own that
// charges each entry's disk cost to charge before writing it, stopping at
// the first refusal (a host's disk admission): the cap holds while the
// stream expands, whatever its compressed size.
func ExtractTarCharged(ctx context.Context, r io.Reader, dst string, charge func(int64) error) (skipped int, err error) {
	return extractTar(ctx, r, dst, 0, charge)
}

// extractTar is ExtractTar that, when charge is set, charges each entry's
// disk cost (entryCost) before writing it and stops at the first refusal:
// the limit holds while the stream expands, whatever its headers promise.
func extractTar(ctx context.Context, r io.Reader, dst string, maxBytes int64, charge func(int64) error) (skipped int, err error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return 0, errdefs.Invalid("rootfs tarball: bad gzip stream: %v", err)
		}
		defer gz.Close()
		in = gz
	}
	tr := tar.NewReader(in)
	var written int64
	type dirTime struct {
		name  string
		mtime time.Time
	}
	var dirs []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return skipped, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return skipped, errdefs.Invalid("rootfs tarball: %v (send a tar or tar.gz stream)", err)
		}
		name, err := tarEntryName(hdr.Name)
		if err != nil {
			return skipped, err
		}
		if name == "." {
			continue
		}
		mode := fs.FileMode(hdr.Mode & 0o7777)
		if charge != nil {
			var size int64
			switch hdr.Typeflag {
			case tar.TypeChar, tar.TypeBlock, tar.TypeFifo, tar.TypeXGlobalHeader:
				// Skipped: nothing written.
			case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
				size = max(hdr.Size, 0)
				fallthrough
			default:
				if err := charge(entryCost(hdr.Typeflag, size)); err != nil {
					return skipped, err
				}
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := mkdirIn(root, name); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
			dirs = append(dirs, dirTime{name, hdr.ModTime})
		case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
			if maxBytes > 0 && written+hdr.Size > maxBytes {
				return skipped, fmt.Errorf("rootfs tarball: more than %d MiB of file data (the server's --max-upload-mb; ask its operator): %w", maxBytes>>20, errdefs.ErrTooLarge)
			}
			n, err := writeEntry(root, name, tr)
			written += n
			if err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
		case tar.TypeSymlink:
			if err := replaceable(root, name); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
			if strings.IndexByte(hdr.Linkname, 0) >= 0 {
				return skipped, errdefs.Invalid("rootfs tarball: entry %q: link target contains NUL", hdr.Name)
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
		case tar.TypeLink:
			target, err := tarEntryName(hdr.Linkname)
			if err != nil {
				return skipped, err
			}
			if err := replaceable(root, name); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
			if err := root.Link(target, name); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			// Device nodes have no business in a template: gVisor gives
			// every sandbox its own /dev.
			skipped++
			continue
		case tar.TypeXGlobalHeader:
			continue
		default:
			return skipped, errdefs.Invalid("rootfs tarball: entry %q has unsupported type %q", hdr.Name, hdr.Typeflag)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return skipped, entryErr(hdr.Name, err)
			}
			continue
		}
		if hdr.Typeflag == tar.TypeLink {
			continue
		}
		if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
			return skipped, entryErr(hdr.Name, err)
		}
		// Chown clears set-id bits: set the mode after it.
		if err := root.Chmod(name, mode|setIDBits(hdr.Mode)); err != nil {
			return skipped, entryErr(hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeDir && !hdr.ModTime.IsZero() {
			root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	// Directory times last: writing into a directory changes its mtime.
	for i := len(dirs) - 1; i >= 0; i-- {
		if !dirs[i].mtime.IsZero() {
			root.Chtimes(dirs[i].name, dirs[i].mtime, dirs[i].mtime)
		}
	}
	return skipped, nil
}

func setIDBits(mode int64) fs.FileMode {
	var m fs.FileMode
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// tarEntryName turns a tar entry name into a clean path relative to the
// target, refusing anything that would name a place outside it.
func tarEntryName(raw string) (string, error) {
	if raw == "" || strings.IndexByte(raw, 0) >= 0 {
		return "", errdefs.Invalid("rootfs tarball: empty or invalid entry name %q", raw)
	}
	if strings.HasPrefix(raw, "/") {
		return "", errdefs.Invalid("rootfs tarball: entry %q has an absolute path: make the tarball relative to the root (tar -C ROOTFS -cf - .)", raw)
	}
	for _, part := range strings.Split(raw, "/") {
		if part == ".." {
			return "", errdefs.Invalid("rootfs tarball: entry %q contains \"..\": entries must stay inside the root", raw)
		}
	}
	return path.Clean(raw), nil
}

func entryErr(name string, err error) error {
	if _, code := errdefs.HTTPStatus(err); code != "internal" {
		return err
	}
	return errdefs.Invalid("rootfs tarball: entry %q: %v (links must stay inside the root)", name, err)
}

// mkdirIn makes a directory (and its parents) unless one is there.
func mkdirIn(root *os.Root, name string) error {
	if st, err := root.Lstat(name); err == nil {
		if st.IsDir() {
			return nil
		}
		if err := root.Remove(name); err != nil {
			return err
		}
	}
	return root.MkdirAll(name, 0o755)
}

// replaceable makes room for a new non-directory entry: parents exist, and
// an earlier entry of the same name (a symlink, say) is removed rather than
// followed.
func replaceable(root *os.Root, name string) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	st, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		return root.RemoveAll(name)
	}
	return root.Remove(name)
}

func writeEntry(root *os.Root, name string, r io.Reader) (int64, error) {
	if err := replaceable(root, name); err != nil {
		return 0, err
	}
	f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// WriteTar writes the tree under dir as a tar stream: directories, regular
// files and symlinks (as links, never followed) with their numeric owners
// and modes; other file types are left out. The CLI uses it to upload a
// rootfs directory; the server to import one from the operator's import
// directory through the same extraction as an upload.
func WriteTar(ctx context.Context, w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	// Files with several links are written once, then as hard links to
	// that first name (as tar and cp -a keep them).
	type inode struct{ dev, ino uint64 }
	seen := map[inode]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case info.IsDir(), info.Mode().IsRegular():
		default:
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && info.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := seen[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
				hdr.Uname, hdr.Gname = "", ""
				return tw.WriteHeader(hdr)
			}
			seen[key] = hdr.Name
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// OpenRootfs returns a tar stream of a rootfs: the file itself when path
// is a tarball, or a directory's tree written by WriteTar as it is read.
// Close ends the stream (and the writing).
func OpenRootfs(ctx context.Context, path string) (io.ReadCloser, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return os.Open(path)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteTar(ctx, pw, path)) }()
	return pr, nil
}
