package template

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPipConfForExternallyManagedPython: a tree whose python3 carries
// PEP 668's mark (Debian's, as in the base template) gets /etc/pip.conf
// with break-system-packages, so that a user's `pip install` works as in
// E2B's default template; a tree without the mark, or with a pip.conf of
// its own, is left alone, and a link out of the tree is not followed.
func TestPipConfForExternallyManagedPython(t *testing.T) {
	mark := func(t *testing.T, dir, lib string) string {
		t.Helper()
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, lib, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, lib, dir, "EXTERNALLY-MANAGED"), []byte("[externally-managed]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return root
	}
	own := mark(t, "python3.11", "usr/lib")
	os.MkdirAll(filepath.Join(own, "etc"), 0o755)
	os.WriteFile(filepath.Join(own, "etc/pip.conf"), []byte("[global]\nindex-url = http://mirror\n"), 0o644)
	unmarked := t.TempDir()
	os.MkdirAll(filepath.Join(unmarked, "usr/lib/python3.11"), 0o755)
	outside := mark(t, "python3.11", "usr/lib")
	linked := t.TempDir()
	os.MkdirAll(filepath.Join(linked, "usr"), 0o755)
	if err := os.Symlink(filepath.Join(outside, "usr/lib"), filepath.Join(linked, "usr/lib")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, root, want string
	}{
		{"debian", mark(t, "python3.11", "usr/lib"), pipConf},
		{"lib64", mark(t, "python3.12", "usr/lib64"), pipConf},
		{"own pip.conf", own, "[global]\nindex-url = http://mirror\n"},
		{"no mark", unmarked, ""},
		{"python2 only", mark(t, "python2.7", "usr/lib"), ""},
		{"lib links out", linked, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := withRoot(tc.root, allowPip); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(tc.root, "etc/pip.conf"))
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got /etc/pip.conf %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "etc/pip.conf")); !os.IsNotExist(err) {
		t.Errorf("pip.conf written outside the tree through a link: %v", err)
	}

	// Through a whole build: prepareRootfs writes it.
	root := mark(t, "python3.11", "usr/lib")
	envd := filepath.Join(t.TempDir(), "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	if err := prepareRootfs(root, envd); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "etc/pip.conf")); string(got) != pipConf {
		t.Errorf("after prepareRootfs: got /etc/pip.conf %q, want %q", got, pipConf)
	}
}
