package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
)

// Copies between this machine and a sandbox, as `docker cp` does them: a
// file or a directory tree, each file streamed through envd's file routes
// and each directory walked through its filesystem service, so that no
// tool of the sandbox (its tar, its shell) takes part. What neither side
// can carry is skipped and reported to warn: symlinks (envd can neither
// make one nor tell its target as written), devices, FIFOs and sockets.
// Uploaded files get mode 0644 (envd's file route sets no mode); downloaded
// ones keep their permission bits.

// CopyTo copies the local file or directory src to dst in the sandbox. A
// dst that is a directory (or ends in "/") receives src under its own
// name; otherwise dst becomes the copy.
func (f *Files) CopyTo(ctx context.Context, src, dst string, warn func(string)) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	into := strings.HasSuffix(dst, "/")
	if !into {
		if e, err := f.Stat(ctx, dst); err == nil {
			into = e.Dir
			if st.IsDir() && !e.Dir {
				return fmt.Errorf("cannot copy directory %s onto file %s in the sandbox", src, dst)
			}
		} else if connect.CodeOf(err) != connect.CodeNotFound {
			return err
		}
	}
	if into {
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	}
	if !st.IsDir() {
		return f.upload(ctx, src, dst, st)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := path.Join(dst, filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			return f.MakeDir(ctx, target)
		case d.Type().IsRegular():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return f.upload(ctx, p, target, info)
		default:
			warn(fmt.Sprintf("skipped %s: only files and directories are copied (it is a %s)", p, kind(d.Type())))
			return nil
		}
	})
}

func (f *Files) upload(ctx context.Context, src, dst string, st fs.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s: only files and directories are copied", src, kind(st.Mode()))
	}
	r, err := os.Open(src)
	if err != nil {
		return err
	}
	defer r.Close()
	return f.Write(ctx, dst, r)
}

// CopyFrom copies the file or directory src in the sandbox to dst on this
// machine. A dst that is a directory (or ends in "/") receives src under
// its own name; otherwise dst becomes the copy.
func (f *Files) CopyFrom(ctx context.Context, src, dst string, warn func(string)) error {
	e, err := f.Stat(ctx, src)
	if err != nil {
		return err
	}
	src = e.Path // absolute ("~" and relative paths are the user's home's)
	if e.Symlink != "" {
		// The path given is followed, as cp follows its arguments.
		src = e.Symlink
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() || strings.HasSuffix(dst, "/") {
		dst = filepath.Join(dst, path.Base(path.Clean(src)))
	} else if err == nil && e.Dir {
		return fmt.Errorf("cannot copy directory %s onto file %s", src, dst)
	}
	if !e.Dir {
		return f.download(ctx, src, dst, e.Mode)
	}
	return f.downloadDir(ctx, src, dst, e.Mode, warn)
}

// downloadDir copies the directory src to dst. Entry names come from the
// sandbox: each must be one plain path element.
func (f *Files) downloadDir(ctx context.Context, src, dst string, mode fs.FileMode, warn func(string)) error {
	if err := os.Mkdir(dst, mode|0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	entries, err := f.List(ctx, src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name == "" || e.Name == "." || e.Name == ".." || strings.ContainsAny(e.Name, "/\x00") {
			return fmt.Errorf("the sandbox listed an invalid name %q in %s", e.Name, src)
		}
		from, to := path.Join(src, e.Name), filepath.Join(dst, e.Name)
		switch {
		case e.Symlink != "":
			warn(fmt.Sprintf("skipped symlink %s (to %s): only files and directories are copied", from, e.Symlink))
		case e.Dir:
			err = f.downloadDir(ctx, from, to, e.Mode, warn)
		default:
			err = f.download(ctx, from, to, e.Mode)
		}
		if err != nil {
			return err
		}
	}
	return os.Chmod(dst, mode)
}

func (f *Files) download(ctx context.Context, src, dst string, mode fs.FileMode) error {
	if mode == 0 {
		mode = 0o644 // unknown (a file that changed under the listing)
	}
	r, err := f.Open(ctx, src)
	if err != nil {
		return err
	}
	defer r.Close()
	w, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode|0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Close()
		return fmt.Errorf("copy %s from the sandbox: %w", src, err)
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}
