package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A thin template's own image holds only what its build changed over the
// layers below it (BuildRequest.Lowers): the build hands over a tree of
// the changed files, the store installs envd and the sandbox conventions
// on an overlay of that tree over the mounted layers (so a file the lowers
// have is changed, not shadowed by an empty one), drops what ended up the
// same as below, and writes the rest as a small EROFS image. Thin images
// carry no extended attributes (mkfs.erofs -x -1): gVisor's overlay failed
// to mount such a lower built with them. What a thin layer cannot say
// (a deleted file, a directory made opaque, a file capability) makes the
// build flat instead (ThinBlocker).

// MountImage mounts the EROFS image read-only at target (a file-backed
// mount, Linux 6.12 or later).
func MountImage(image, target string) error {
	if err := unix.Mount(image, target, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("mount EROFS image %s: %w (the host kernel needs EROFS with file-backed mounts, Linux 6.12 or later)", image, err)
	}
	return nil
}

// Unmount detaches target, retrying while it is busy, lazily at last.
func Unmount(target string) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = unix.Unmount(target, 0); err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if derr := unix.Unmount(target, unix.MNT_DETACH); derr != nil {
		return fmt.Errorf("unmount %s: %w", target, errors.Join(err, derr))
	}
	return nil
}

// MountOverlay mounts at target an overlay of lowers (first = top) with
// upper and work (both empty: read-only). fsconfig takes the lower dirs
// one by one, so deep stacks do not hit the one-page limit of mount(2)'s
// option string.
func MountOverlay(lowers []string, upper, work, target string) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("overlayfs: %w (the host kernel needs overlayfs and the new mount API, Linux 6.8 or later)", err)
	}
	defer unix.Close(fd)
	set := func(k, v string) error {
		if err := unix.FsconfigSetString(fd, k, v); err != nil {
			return fmt.Errorf("overlayfs %s=%s: %w", k, v, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if upper != "" {
		if err := set("upperdir", upper); err != nil {
			return err
		}
		if err := set("workdir", work); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("overlayfs: create: %w", err)
	}
	var attrs int
	if upper == "" {
		attrs = unix.MOUNT_ATTR_RDONLY
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("overlayfs: mount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("overlayfs: attach at %s: %w", target, err)
	}
	return nil
}

// ThinBlocker says why the overlay upper dir (or tree of changes) dir
// cannot be a thin layer: it deletes something below it (a whiteout or an
// opaque directory) or sets a file capability, which a thin layer (no
// extended attributes) would lose. "" if nothing does.
func ThinBlocker(dir string) string {
	reason := ""
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || reason != "" {
			return filepath.SkipAll
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			if st.Rdev == 0 {
				reason = "it deletes /" + rel
			}
		case unix.S_IFDIR:
			for _, x := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
				if n, _ := unix.Lgetxattr(p, x, nil); n > 0 {
					reason = "it replaces the directory /" + rel
				}
			}
		case unix.S_IFREG:
			for _, x := range []string{"trusted.overlay.whiteout", "user.overlay.whiteout"} {
				if _, err := unix.Lgetxattr(p, x, nil); err == nil {
					reason = "it deletes /" + rel
				}
			}
			if n, _ := unix.Lgetxattr(p, "security.capability", nil); n > 0 {
				reason = "it sets file capabilities on /" + rel
			}
		}
		if reason != "" {
			return filepath.SkipAll
		}
		return nil
	})
	return reason
}

// stackMounts mounts the layers' images read-only under mnt, top first,
// and returns their mount points and what unmounts them.
func stackMounts(paths []string, mnt string) (dirs []string, unmount func() error, err error) {
	unmount = func() error {
		var errs []error
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := Unmount(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for i, p := range paths {
		d := filepath.Join(mnt, fmt.Sprintf("l%d", i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, nil, errors.Join(err, unmount())
		}
		if err := MountImage(p, d); err != nil {
			return nil, nil, errors.Join(err, unmount())
		}
		dirs = append(dirs, d)
	}
	return dirs, unmount, nil
}

// prepareThin installs envd and the template's settings into dir/rootfs,
// a tree of changes over t.Lowers, then drops from it what is the same as
// below. If what it did cannot be a thin layer (ThinBlocker), the tree
// becomes the whole merged root and t.Lowers nil: a flat template.
func (s *Store) prepareThin(dir string, t *Template) error {
	rootfs := filepath.Join(dir, "rootfs")
	paths := s.LayerPaths(t.Lowers)
	for i, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("layer sha256:%s below the template: %w", t.Lowers[i], err)
		}
	}
	mnt := filepath.Join(dir, "mnt")
	defer os.RemoveAll(mnt)
	lowers, unmountLowers, err := stackMounts(paths, mnt)
	if err != nil {
		return err
	}
	defer unmountLowers()
	work, merged := filepath.Join(mnt, "work"), filepath.Join(mnt, "merged")
	for _, d := range []string{work, merged} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := MountOverlay(lowers, rootfs, work, merged); err != nil {
		return err
	}
	err = s.prepare(merged, t)
	flat := ""
	if err == nil {
		if why := ThinBlocker(rootfs); why != "" {
			s.log.Info("template is flat, not thin", "template", t.Name, "because", why)
			flat = filepath.Join(dir, "flat")
			if err = os.Mkdir(flat, 0o755); err == nil {
				err = cpTree(merged, flat)
			}
		}
	}
	if uerr := Unmount(merged); uerr != nil {
		return errors.Join(err, uerr)
	}
	if err != nil {
		return err
	}
	if flat != "" {
		if err := os.RemoveAll(rootfs); err != nil {
			return err
		}
		t.Lowers = nil
		return os.Rename(flat, rootfs)
	}
	// The overlay's bookkeeping (work dir, origin xattrs) stays out of
	// the image: it carries no xattrs, and work is not under rootfs.
	return dedupe(rootfs, lowers)
}

// prepare bakes envd and the template's defaults into the tree root.
func (s *Store) prepare(root string, t *Template) error {
	if err := prepareRootfs(root, s.envd); err != nil {
		if rootRefused(err) {
			return err
		}
		return fmt.Errorf("prepare rootfs: %w", err)
	}
	return withRoot(root, func(r *os.Root) error { return applyDefaults(r, &t.Defaults) })
}

// cpTree copies the tree src into dst with the host's cp: links stay
// links, owners, modes, times and hard links are kept.
func cpTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", "--", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// dedupe removes from the tree of changes every entry the layers below
// (mounted at lowers, top first) already have with the same type, owner,
// mode and content, and the directories left empty that they have too.
func dedupe(tree string, lowers []string) error {
	roots := make([]*os.Root, 0, len(lowers))
	for _, l := range lowers {
		r, err := os.OpenRoot(l)
		if err != nil {
			return err
		}
		defer r.Close()
		roots = append(roots, r)
	}
	var paths []string
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != tree {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Deepest first: a directory's entries are decided before it is.
	sort.Slice(paths, func(i, j int) bool { return paths[i] > paths[j] })
	for _, p := range paths {
		rel, _ := filepath.Rel(tree, p)
		if same, err := sameBelow(p, rel, roots); err != nil {
			return err
		} else if same {
			if err := os.Remove(p); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
				return err
			}
		}
	}
	return nil
}

// sameBelow says whether the layers below show rel as the tree's p is: a
// directory only with no entries left in p.
func sameBelow(p, rel string, roots []*os.Root) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false, err
	}
	var low fs.FileInfo
	var in *os.Root
	for _, r := range roots {
		fi, err := r.Lstat(rel)
		if err == nil {
			low, in = fi, r
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return false, nil // not surely the visible one: keep it
		}
	}
	if low == nil {
		return false, nil
	}
	lst, ok := low.Sys().(*syscall.Stat_t)
	if !ok || lst.Mode != st.Mode || lst.Uid != st.Uid || lst.Gid != st.Gid {
		return false, nil
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		f, err := os.Open(p)
		if err != nil {
			return false, err
		}
		names, _ := f.Readdirnames(1)
		f.Close()
		return len(names) == 0, nil
	case unix.S_IFLNK:
		a, err := os.Readlink(p)
		if err != nil {
			return false, err
		}
		b, err := in.Readlink(rel)
		return err == nil && a == b, nil
	case unix.S_IFREG:
		if lst.Size != st.Size {
			return false, nil
		}
		return sameContent(p, in, rel)
	default:
		return uint64(lst.Rdev) == uint64(st.Rdev), nil
	}
}

func sameContent(p string, in *os.Root, rel string) (bool, error) {
	a, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer a.Close()
	b, err := in.Open(rel)
	if err != nil {
		return false, nil
	}
	defer b.Close()
	ba, bb := make([]byte, 256<<10), make([]byte, 256<<10)
	for {
		na, ea := io.ReadFull(a, ba)
		nb, eb := io.ReadFull(b, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			return (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF), nil
		}
	}
}

// extractImage copies the tree in dir/image.erofs to dir/rootfs (a thin
// template keeps no tree beside its image; a new envd is installed on it).
func extractImage(ctx context.Context, dir string) error {
	mnt := filepath.Join(dir, "mnt", "own")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Join(dir, "mnt"))
	if err := MountImage(filepath.Join(dir, "image.erofs"), mnt); err != nil {
		return err
	}
	rootfs := filepath.Join(dir, "rootfs")
	err := os.Mkdir(rootfs, 0o755)
	if err == nil {
		err = cpTree(mnt, rootfs)
	}
	return errors.Join(err, Unmount(mnt))
}
