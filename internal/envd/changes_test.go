package envd

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The changes routes (ChangesPath) on directories of the host: what a
// sandbox's pause without memory saves, and what its resume puts back.

// mk builds entries under root: "d:" directory, "l:target" symlink,
// "p:" FIFO, else file content.
func mk(t *testing.T, root string, entries map[string]string) {
	t.Helper()
	for name, spec := range entries {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case spec == "d:":
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(spec, "l:"):
			err = os.Symlink(spec[2:], p)
		case spec == "p:":
			err = unix.Mkfifo(p, 0o640)
		default:
			err = os.WriteFile(p, []byte(spec), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// snapshot describes every entry of a tree as the walk sees it: type,
// mode, owner, mtime (seconds), content or link target, user xattrs.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	tr, err := openTree(root)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	out := map[string]string{}
	err = tr.walk(func(dirfd int, name, rel string, st *unix.Stat_t) error {
		p := filepath.Join(root, rel)
		desc := fmt.Sprintf("%o %d:%d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" mtime=%d %q links=%d", st.Mtim.Sec, b, st.Nlink)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case unix.S_IFDIR:
			desc += fmt.Sprintf(" mtime=%d", st.Mtim.Sec)
		}
		if v, err := getXattr(p, "user.e2b.k"); err == nil {
			desc += " xattr=" + string(v)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func saveTree(t *testing.T, root string, since time.Time) []byte {
	t.Helper()
	tr, err := openTree(root)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.close()
	var buf bytes.Buffer
	if err := tr.save(&buf, since); err != nil {
		t.Fatalf("save: %v", err)
	}
	return buf.Bytes()
}

func restoreTree(root string, archive []byte) error {
	tr, err := openTree(root)
	if err != nil {
		return err
	}
	defer tr.close()
	return tr.restore(bytes.NewReader(archive))
}

// template is what both the paused sandbox and the fresh boot start from.
var template = map[string]string{
	"bin/sh": "shell", "bin/yes": "yes", "etc/hosts": "127.0.0.1 localhost\n",
	"old/dir/file": "x", "becomes-file/child": "c", "becomes-dir": "f", "becomes-link": "f",
	"unchanged": "same", "lib": "d:", "usr": "d:",
}

func TestChangesRoundTrip(t *testing.T) {
	paused, fresh := t.TempDir(), t.TempDir()
	mk(t, paused, template)
	mk(t, fresh, template)
	// Both trees' directories get one past time, as a template image's
	// have: a directory the restore writes into must keep it.
	past := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, root := range []string{paused, fresh} {
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				err = os.Chtimes(p, past, past)
			}
			return err
		})
	}
	// ctime has no setter: the template is older than since by waiting.
	time.Sleep(20 * time.Millisecond)
	since := time.Now()
	time.Sleep(20 * time.Millisecond)
	os.Remove(filepath.Join(paused, "bin/yes"))
	os.RemoveAll(filepath.Join(paused, "old"))
	os.RemoveAll(filepath.Join(paused, "becomes-file"))
	os.Remove(filepath.Join(paused, "becomes-dir"))
	os.Remove(filepath.Join(paused, "becomes-link"))
	long := strings.Repeat("n", 150)
	mk(t, paused, map[string]string{
		"becomes-file": "now a file", "becomes-dir/inside": "in", "becomes-link": "l:/proc/self/mem",
		"home/user/new/deep/f": "deep", "tmp/kept": "tmp", "tmp/link": "l:/tmp/kept",
		"tmp/fifo": "p:", "home/user/" + long: "long name", "home/user/bad\xffname": "not utf-8",
		"etc/hosts": "10.0.0.1 changed\n", "dev-link": "l:/dev/zero", "lib/dangling": "l:../nowhere",
	})
	unix.Chmod(filepath.Join(paused, "tmp/kept"), 0o4751)
	os.Link(filepath.Join(paused, "tmp/kept"), filepath.Join(paused, "tmp/hard"))
	if err := unix.Setxattr(filepath.Join(paused, "etc/hosts"), "user.e2b.k", []byte("v"), 0); err != nil && !xattrUnsupported(err) {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Lchown(filepath.Join(paused, "tmp/kept"), 1000, 1001)
		os.Lchown(filepath.Join(paused, "tmp/link"), 1000, 1000)
		unix.Chmod(filepath.Join(paused, "tmp/kept"), 0o4751) // chown cleared set-uid
	}
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	os.Chtimes(filepath.Join(paused, "home/user/new/deep/f"), old, old)
	os.Chtimes(filepath.Join(paused, "home/user/new"), old, old)

	archive := saveTree(t, paused, since)
	names := archiveNames(t, archive)
	for _, n := range []string{"unchanged", "bin/sh", "usr"} {
		if names[n] {
			t.Errorf("archive has %q, which did not change", n)
		}
	}
	for _, n := range []string{"etc/hosts", "tmp/kept", "becomes-link", changesList} {
		if !names[n] {
			t.Errorf("archive lacks %q; has %v", n, names)
		}
	}
	if err := restoreTree(fresh, archive); err != nil {
		t.Fatalf("restore: %v", err)
	}
	want, got := snapshot(t, paused), snapshot(t, fresh)
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: restored %q, want %q", k, got[k], w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: restored %q, which the paused tree no longer had", k, g)
		}
	}
}

func archiveNames(t *testing.T, archive []byte) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatalf("archive: %v", err)
		}
		names[h.Name] = true
	}
}

// A symlink is saved as a link: one to a huge sparse file or to
// /proc/self/mem costs its name, not the target's bytes.
func TestChangesKeepLinksAsLinks(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	sparse := filepath.Join(outside, "sparse")
	f, _ := os.Create(sparse)
	f.Truncate(8 << 30)
	f.Close()
	mk(t, dir, map[string]string{"big": "l:" + sparse, "mem": "l:/proc/self/mem", "zero": "l:/dev/zero"})
	if archive := saveTree(t, dir, time.Time{}); len(archive) > 64<<10 {
		t.Errorf("archive of three links is %d bytes, want a few KiB", len(archive))
	}
}

// tarOf builds an archive from headers (content for regular files).
func tarOf(t *testing.T, entries ...any) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i < len(entries); i += 2 {
		h := entries[i].(*tar.Header)
		body := entries[i+1].(string)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return buf.Bytes()
}

func list(names ...string) string { return strings.Join(names, "\x00") + "\x00" }

// A restore writes nothing outside the tree: not through names, not
// through links already there or made by the archive.
func TestRestoreStaysInside(t *testing.T) {
	reg := func(name string) *tar.Header { return &tar.Header{Typeflag: tar.TypeReg, Name: name} }
	paths := &tar.Header{Typeflag: tar.TypeReg, Name: changesList}
	cases := []struct {
		name    string
		archive func(outside string) []byte
	}{
		{"dot-dot", func(string) []byte { return tarOf(t, reg("../escaped"), "x", paths, list()) }},
		{"dot-dot inside", func(string) []byte { return tarOf(t, reg("a/../../escaped"), "x", paths, list()) }},
		{"absolute", func(o string) []byte { return tarOf(t, reg(o+"/escaped"), "x", paths, list()) }},
		{"link made by the archive", func(o string) []byte {
			return tarOf(t, &tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: o}, "", reg("out/escaped"), "x", paths, list("out"))
		}},
		{"link in the tree", func(string) []byte { return tarOf(t, reg("there/escaped"), "x", paths, list("there")) }},
		{"hard link out", func(o string) []byte {
			return tarOf(t, &tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: o + "/victim"}, "", paths, list("h"))
		}},
		{"agentenv's directory", func(string) []byte { return tarOf(t, reg(".agentenv/envd"), "x", paths, list()) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, outside := t.TempDir(), t.TempDir()
			os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o644)
			os.Symlink(outside, filepath.Join(dir, "there"))
			err := restoreTree(dir, c.archive(outside))
			if err == nil {
				t.Errorf("restore succeeded, want it refused")
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("restore (%v) wrote outside the tree: %v", err, ents)
			}
		})
	}
}

func TestRestoreRefusesIncompleteArchives(t *testing.T) {
	reg := &tar.Header{Typeflag: tar.TypeReg, Name: "f"}
	paths := &tar.Header{Typeflag: tar.TypeReg, Name: changesList}
	whole := tarOf(t, reg, "data", paths, list("f"))
	for name, archive := range map[string][]byte{
		"no path list":          tarOf(t, reg, "data"),
		"entry after the list":  tarOf(t, paths, list("f"), reg, "data"),
		"cut in the middle":     whole[:700],
		"cut before the header": whole[:512+512],
	} {
		t.Run(name, func(t *testing.T) {
			var ae *archiveError
			if err := restoreTree(t.TempDir(), archive); !errors.As(err, &ae) {
				t.Errorf("restore: %v, want an archive error", err)
			}
		})
	}
}

// Other filesystems mounted in the tree (/proc, /dev, the read-only anchor
// in /tmp, any bind) are neither saved nor written by a restore.
func TestChangesSkipOtherMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount")
	}
	dir, src := t.TempDir(), t.TempDir()
	mk(t, src, map[string]string{"secret": "s"})
	mk(t, dir, map[string]string{"tmp/anchor": "d:", "tmp/kept": "k"})
	anchor := filepath.Join(dir, "tmp/anchor")
	if err := unix.Mount(src, anchor, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	defer unix.Unmount(anchor, unix.MNT_DETACH)
	unix.Mount("", anchor, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	names := archiveNames(t, saveTree(t, dir, time.Time{}))
	if names["tmp/anchor"] || names["tmp/anchor/secret"] || !names["tmp/kept"] {
		t.Errorf("archive names %v: want tmp/kept, nothing of the mount", names)
	}
	archive := tarOf(t, &tar.Header{Typeflag: tar.TypeReg, Name: "tmp/anchor/planted"}, "x",
		&tar.Header{Typeflag: tar.TypeReg, Name: changesList}, list("tmp", "tmp/kept", "tmp/anchor", "tmp/anchor/planted"))
	if err := restoreTree(dir, archive); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if _, err := os.Stat(filepath.Join(src, "planted")); err == nil {
		t.Error("restore wrote into another mount")
	}
}

func TestChangesRoutes(t *testing.T) {
	dir := t.TempDir()
	mk(t, dir, map[string]string{"f": "data"})
	s := New(Config{AccessToken: "tok"})
	s.changesRoot = dir
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	do := func(method, query, token string, body io.Reader) (int, []byte) {
		req, _ := http.NewRequest(method, srv.URL+ChangesPath+query, body)
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, _ := do("GET", "?since=0", "", nil); code != http.StatusUnauthorized {
		t.Errorf("GET without token: %d, want 401", code)
	}
	if code, _ := do("POST", "", "wrong", strings.NewReader("")); code != http.StatusUnauthorized {
		t.Errorf("POST with a wrong token: %d, want 401", code)
	}
	if code, _ := do("GET", "?since=yesterday", "tok", nil); code != http.StatusBadRequest {
		t.Errorf("GET with a bad since: %d, want 400", code)
	}
	code, archive := do("GET", "?since="+strconv.FormatInt(time.Now().Add(-time.Hour).UnixNano(), 10), "tok", nil)
	if code != http.StatusOK || !archiveNames(t, archive)["f"] {
		t.Fatalf("GET: %d, want 200 with f", code)
	}
	os.Remove(filepath.Join(dir, "f"))
	mk(t, dir, map[string]string{"extra": "gone after restore"})
	if code, b := do("POST", "", "tok", bytes.NewReader(archive)); code != http.StatusNoContent {
		t.Fatalf("POST: %d %s, want 204", code, b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "data" {
		t.Errorf("after POST f = %q, want data", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "extra")); err == nil {
		t.Error("after POST extra is still there")
	}
	if code, b := do("POST", "", "tok", strings.NewReader("not a tar")); code != http.StatusBadRequest {
		t.Errorf("POST of garbage: %d %s, want 400", code, b)
	}
}
