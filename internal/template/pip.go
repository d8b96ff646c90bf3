package template

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"strings"
)

// Debian's and Ubuntu's python3 mark their Python "externally managed"
// (PEP 668: a file EXTERNALLY-MANAGED beside the standard library), and
// pip then refuses every install outside a virtual environment, `pip
// install --user` included. E2B's default template runs a Python that is
// not the distribution's, so agent code there runs `pip install x` and gets
// it (in ~/.local, as user, whose site-packages is root's). A template
// whose Python carries the mark gets /etc/pip.conf with
// break-system-packages: pip installs again, as user into ~/.local and as
// root (sudo) into /usr/local, never over the files apt installed
// (Debian's pip writes only there). A config file rather than deleting the
// mark: the mark belongs to a package, and the next apt upgrade of python
// inside a sandbox would put it back.
const (
	pipConfPath = "etc/pip.conf"
	pipConf     = "# Written by agentenv: pip installs outside a virtual environment, as in\n" +
		"# E2B's default template (as user into ~/.local; see PEP 668).\n" +
		"[global]\nbreak-system-packages = true\n"
)

// allowPip writes /etc/pip.conf into a tree whose Python is marked
// externally managed, unless the tree has a pip.conf of its own (its
// author's choice stands).
func allowPip(root *os.Root) error {
	if !externallyManaged(root) {
		return nil
	}
	if _, err := root.Lstat(pipConfPath); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := root.MkdirAll(path.Dir(pipConfPath), 0o755); err != nil {
		return err
	}
	return root.WriteFile(pipConfPath, []byte(pipConf), 0o644)
}

// externallyManaged reports whether a python3.* under /usr/lib or
// /usr/lib64 has the PEP 668 mark.
func externallyManaged(root *os.Root) bool {
	for _, dir := range []string{"usr/lib", "usr/lib64"} {
		entries, err := fs.ReadDir(root.FS(), dir)
		if err != nil {
			// Missing, or a link out of the tree (os.Root refuses it):
			// nothing of ours to configure there.
			continue
		}
		for _, e := range entries {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "python3") {
				continue
			}
			st, err := root.Lstat(path.Join(dir, e.Name(), "EXTERNALLY-MANAGED"))
			if err == nil && st.Mode().IsRegular() {
				return true
			}
		}
	}
	return false
}
