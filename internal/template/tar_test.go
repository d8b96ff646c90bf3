package template

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteTarKeepsHardLinks: a directory's hard links survive the
// upload/import round trip as links, not as copies.
func TestWriteTarKeepsHardLinks(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(src, "a"), []byte("data"), 0o644)
	if err := os.Link(filepath.Join(src, "a"), filepath.Join(src, "b")); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(WriteTar(context.Background(), pw, src)) }()
	if _, err := ExtractTar(context.Background(), pr, dst, 0); err != nil {
		t.Fatal(err)
	}
	a, err1 := os.Stat(filepath.Join(dst, "a"))
	b, err2 := os.Stat(filepath.Join(dst, "b"))
	if err1 != nil || err2 != nil {
		t.Fatalf("stat: %v %v", err1, err2)
	}
	if got, want := a.Sys().(*syscall.Stat_t).Ino, b.Sys().(*syscall.Stat_t).Ino; got != want {
		t.Errorf("got inodes %d and %d, want one file with two links", got, want)
	}
}
