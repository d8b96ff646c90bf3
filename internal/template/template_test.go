package template_test

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

func TestValidName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"busybox", true},
		{"a", true},
		{"0day", true},
		{"my.tpl_v2-x", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"Busybox", false},
		{"-x", false},
		{".hidden", false},
		{"_x", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a\n", false},
		{"ünicode", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := template.ValidName(tt.name)
			if (err == nil) != tt.ok {
				t.Fatalf("ValidName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("ValidName(%q) = %v, want an ErrInvalid", tt.name, err)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	imports := filepath.Join(dir, "imports")
	os.MkdirAll(filepath.Join(imports, "tree"), 0o755)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("host secret"), 0o600)
	os.Symlink(filepath.Join(dir, "secret"), filepath.Join(imports, "escape"))
	os.Symlink("tree", filepath.Join(imports, "inside"))
	envd := filepath.Join(dir, "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	store, err := template.OpenWithOptions(filepath.Join(dir, "templates"), envd, template.Options{ImportDir: imports}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	noImports, err := template.Open(filepath.Join(dir, "templates2"), envd, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		store *template.Store
		req   template.BuildRequest
		ok    bool
	}{
		{"busybox", store, template.BuildRequest{Name: "bb", Busybox: true}, true},
		{"debian", store, template.BuildRequest{Name: "deb", Debian: "bookworm"}, true},
		{"debian with packages", store, template.BuildRequest{Name: "deb", Debian: "bookworm", Packages: []string{"python3", "libc6-dev", "g++"}}, true},
		{"import relative", store, template.BuildRequest{Name: "r", Rootfs: "tree"}, true},
		{"import absolute inside", store, template.BuildRequest{Name: "r", Rootfs: filepath.Join(imports, "tree")}, true},
		{"import symlink inside", store, template.BuildRequest{Name: "r", Rootfs: "inside"}, true},
		{"upload", store, template.BuildRequest{Name: "r", Upload: strings.NewReader("")}, true},
		{"bad name", store, template.BuildRequest{Name: "Bad", Busybox: true}, false},
		{"no source", store, template.BuildRequest{Name: "x"}, false},
		{"two sources", store, template.BuildRequest{Name: "x", Busybox: true, Debian: "bookworm"}, false},
		{"upload and import", store, template.BuildRequest{Name: "x", Rootfs: "tree", Upload: strings.NewReader("")}, false},
		{"bad suite", store, template.BuildRequest{Name: "x", Debian: "Bookworm"}, false},
		{"suite with slash", store, template.BuildRequest{Name: "x", Debian: "../bookworm"}, false},
		{"client mirror", store, template.BuildRequest{Name: "x", Debian: "jammy", Mirror: "http://127.0.0.1:1/evil"}, false},
		{"bad package", store, template.BuildRequest{Name: "x", Debian: "bookworm", Packages: []string{"vim;rm -rf /"}}, false},
		{"option as package", store, template.BuildRequest{Name: "x", Debian: "bookworm", Packages: []string{"--foo"}}, false},
		{"packages without debian", store, template.BuildRequest{Name: "x", Busybox: true, Packages: []string{"vim"}}, false},
		{"host path outside imports", store, template.BuildRequest{Name: "x", Rootfs: dir}, false},
		{"dot-dot out of imports", store, template.BuildRequest{Name: "x", Rootfs: "../secret"}, false},
		{"symlink out of imports", store, template.BuildRequest{Name: "x", Rootfs: "escape"}, false},
		{"missing import", store, template.BuildRequest{Name: "x", Rootfs: "missing.tar"}, false},
		{"import without import dir", noImports, template.BuildRequest{Name: "x", Rootfs: "/etc"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.store.Validate(tt.req)
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tt.req, err, tt.ok)
			}
			if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Validate(%+v) = %v, want an ErrInvalid", tt.req, err)
			}
		})
	}
}
