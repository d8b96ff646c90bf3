// Package atomicfile is the one way agentenv persists a file: the content
// goes to a temporary file in the same directory, which is synced, renamed
// over the target, and the directory synced, so a crash or power loss at
// any point leaves either the old content or the new one, never an empty
// or partial file. It must not be used for directories (a rename of a
// directory has no content to sync) and does nothing else.
package atomicfile

import (
	"bufio"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data, with permissions perm (not narrowed
// by the umask).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write replaces path with what fill writes, with permissions perm. If
// fill fails, path is left as it was.
func Write(path string, perm fs.FileMode, fill func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	// A name of its own per write: two writers of one path never share a
	// temporary file. A leading dot keeps it out of name-based listings.
	f, err := os.CreateTemp(dir, "."+base+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	step("created")
	bw := bufio.NewWriterSize(f, 64<<10)
	if err := fill(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	step("written")
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	step("synced")
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	step("renamed")
	return syncDir(dir)
}

// Rename moves src, a file another program wrote (mkfs.erofs, go
// install), to dst durably: src's content is synced before the rename and
// dst's directory after it. src and dst must be on one filesystem.
func Rename(src, dst string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// step is called between the steps of Write; a test replaces it to stop
// the writer there.
var step = func(string) {}
