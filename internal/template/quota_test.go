package template_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// bomb streams a gzip'd tar whose entries fill writes: a few MB on the
// wire that expand to whatever the entries say (11.9 MB of gzip can become
// 2.6 GiB). The writer stops when the test ends.
func bomb(t *testing.T, fill func(tw *tar.Writer) error) io.Reader {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	go func() {
		gz, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		tw := tar.NewWriter(gz)
		err := fill(tw)
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = gz.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// zeros writes n files of size bytes of zeros.
func zeros(n int, size int64) func(tw *tar.Writer) error {
	return func(tw *tar.Writer) error {
		buf := make([]byte, 1<<20)
		for i := range n {
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%06d", i), Mode: 0o644, Size: size, Typeflag: tar.TypeReg,
				Uid: os.Getuid(), Gid: os.Getgid()}); err != nil {
				return err
			}
			for left := size; left > 0; {
				k := min(left, int64(len(buf)))
				if _, err := tw.Write(buf[:k]); err != nil {
					return err
				}
				left -= k
			}
		}
		return nil
	}
}

// fakeBudget stands for the host's disk budget (sandbox.Disk.Reserve).
type fakeBudget struct {
	mu           sync.Mutex
	budget, held int64
	peak         int64
}

func (f *fakeBudget) reserve(what string, n int64) (func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held+n > f.budget {
		return nil, errdefs.InsufficientStorage("no room for %s", what)
	}
	f.held += n
	f.peak = max(f.peak, f.held)
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.held -= n
			f.mu.Unlock()
		})
	}, nil
}

func openStore(t *testing.T, opts template.Options) (*template.Store, string) {
	t.Helper()
	testenv.NeedRoot(t) // builds chown files to the sandbox user
	testenv.NeedCommand(t, "mkfs.erofs", "writes template images (package erofs-utils)")
	dir := t.TempDir()
	s, err := template.OpenWithOptions(dir, builtEnvd(t), opts, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// TestUploadBombIsStopped: an upload that expands past the templates'
// byte quota or the host's disk budget is stopped while it is unpacked
// (before it has written much more than the limit), answers 507, is not
// listed, and leaves neither files nor charges behind.
func TestUploadBombIsStopped(t *testing.T) {
	tests := []struct {
		name  string
		fill  func(tw *tar.Writer) error
		limit int64
	}{
		// One entry whose header says 4 GiB: refused before any byte.
		{"one huge file", zeros(1, 4<<30), 16 << 20},
		// Many 1 MiB files: refused part way.
		{"many files", zeros(1000, 1<<20), 16 << 20},
		// Empty files cost inodes: refused part way too.
		{"empty files", zeros(100000, 0), 4 << 20},
	}
	for _, tt := range tests {
		for _, by := range []string{"quota", "budget"} {
			t.Run(tt.name+"/"+by, func(t *testing.T) {
				limit := tt.limit
				fb := &fakeBudget{budget: limit}
				opts := template.Options{MaxTemplateBytes: limit}
				if by == "budget" {
					opts = template.Options{Reserve: fb.reserve}
				}
				s, dir := openStore(t, opts)
				_, err := s.Build(context.Background(), template.BuildRequest{Name: "bomb", Upload: bomb(t, tt.fill)}, noProgress)
				if !errors.Is(err, errdefs.ErrInsufficientStorage) {
					t.Fatalf("build of a bomb: %v, want insufficient storage (507)", err)
				}
				if _, err := s.Get("bomb"); !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("template listed after a refused build: %v", err)
				}
				noStaging(t, dir)
				if n := template.DiskUsage(dir); n > 1<<20 {
					t.Errorf("the refused build left %d bytes in the store", n)
				}
				if got := s.DiskBytes(); got != 0 {
					t.Errorf("DiskBytes after a refused build = %d, want 0", got)
				}
				if fb.held != 0 {
					t.Errorf("disk budget still holds %d bytes after the build", fb.held)
				}
				if fb.peak > limit {
					t.Errorf("the build held %d bytes of a %d budget", fb.peak, limit)
				}
				t.Logf("%v", err)
			})
		}
	}
}

// TestTemplateQuotas: --max-templates counts templates and builds of new
// names (a rebuild adds none); a build within --max-template-bytes is
// counted at its size, and gives its charges back.
func TestTemplateQuotas(t *testing.T) {
	fb := &fakeBudget{budget: 1 << 40}
	s, _ := openStore(t, template.Options{MaxTemplates: 2, MaxTemplateBytes: 1 << 30, Reserve: fb.reserve})
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := s.Build(ctx, template.BuildRequest{Name: name, Busybox: true}, noProgress); err != nil {
			t.Fatalf("build %s: %v", name, err)
		}
	}
	if err := s.CanBuild("c"); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Errorf("CanBuild of a third template: %v, want insufficient storage", err)
	}
	if _, err := s.Build(ctx, template.BuildRequest{Name: "c", Busybox: true}, noProgress); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Errorf("build of a third template: %v, want insufficient storage", err)
	}
	if _, err := s.Build(ctx, template.BuildRequest{Name: "a", Busybox: true}, noProgress); err != nil {
		t.Errorf("rebuild at the count limit: %v", err)
	}
	if err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Build(ctx, template.BuildRequest{Name: "c", Busybox: true}, noProgress); err != nil {
		t.Errorf("build after a delete: %v", err)
	}
	// Each counts what its directory takes; nothing stays reserved.
	var want int64
	for _, tp := range s.List() {
		want += template.DiskUsage(filepath.Join(tmplDir(t, s, tp.Name)))
	}
	if got := s.DiskBytes(); got != want || got == 0 {
		t.Errorf("DiskBytes = %d, want %d (the directories' use)", got, want)
	}
	if fb.held != 0 {
		t.Errorf("disk budget still holds %d bytes after the builds", fb.held)
	}
}

// tmplDir is a template's directory (beside its image).
func tmplDir(t *testing.T, s *template.Store, name string) string {
	t.Helper()
	return filepath.Dir(s.ImagePath(name))
}

// TestClientDiskMBCap: a client's diskMB is capped by the operator's
// --max-disk-mb (default 10240), whatever the absolute ceiling (1 TiB).
func TestClientDiskMBCap(t *testing.T) {
	envd := filepath.Join(t.TempDir(), "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	open := func(maxMB int) *template.Store {
		s, err := template.OpenWithOptions(t.TempDir(), envd, template.Options{MaxDiskMB: maxMB}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		maxMB, diskMB int
		ok            bool
	}{
		{0, 0, true},
		{0, 10240, true},
		{0, 10241, false},
		{0, template.MaxDiskMB, false},
		{2048, 2048, true},
		{2048, 4096, false},
		{2048, 32, false},
		{template.MaxDiskMB, template.MaxDiskMB, true},
		{2 * template.MaxDiskMB, template.MaxDiskMB + 1, false},
	}
	for _, tt := range tests {
		err := open(tt.maxMB).Validate(template.BuildRequest{Name: "x", Busybox: true, DiskMB: tt.diskMB})
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
			t.Errorf("--max-disk-mb %d, diskMB %d: got %v, want ok=%v (else invalid argument)", tt.maxMB, tt.diskMB, err, tt.ok)
		}
	}
}
