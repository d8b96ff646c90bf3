package template

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtractTar feeds arbitrary tar streams (what an API client uploads)
// to the extraction: it never panics and never creates anything outside
// its target directory.
func FuzzExtractTar(f *testing.F) {
	seed := func(hs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			tw.WriteHeader(h)
			if h.Size > 0 {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		return b.Bytes()
	}
	f.Add(seed(&tar.Header{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, &tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}))
	f.Add(seed(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../outside"}, &tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(&tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside/secret"}))
	f.Add(seed(&tar.Header{Name: "/abs", Typeflag: tar.TypeReg, Size: 1}, &tar.Header{Name: "a/../../x", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(&tar.Header{Name: "d", Typeflag: tar.TypeReg, Size: 1}, &tar.Header{Name: "d", Typeflag: tar.TypeDir}, &tar.Header{Name: "d", Typeflag: tar.TypeSymlink, Linkname: "/"}))
	f.Add([]byte{0x1f, 0x8b, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "root")
		outside := filepath.Join(base, "outside")
		os.Mkdir(dst, 0o755)
		os.Mkdir(outside, 0o700)
		os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
		ExtractTar(context.Background(), bytes.NewReader(data), dst, 1<<20)
		entries, _ := os.ReadDir(base)
		if len(entries) != 2 {
			t.Fatalf("extraction created %d entries beside its target, want none", len(entries)-2)
		}
		out, _ := os.ReadDir(outside)
		if len(out) != 1 {
			t.Fatalf("extraction changed a directory outside its target: %v", out)
		}
		if st, err := os.Stat(filepath.Join(outside, "secret")); err != nil || st.Mode().Perm() != 0o600 || st.Size() != 1 {
			t.Fatalf("extraction changed a file outside its target: %v %v", st, err)
		}
	})
}
