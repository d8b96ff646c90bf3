package template_test

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/template"
)

// A code interpreter build is refused, with a reason, where it cannot
// work: a server without the codeinterp binary, busybox (no Python), or a
// start command of the caller's own (the build sets it).
func TestCodeInterpreterBuildValidation(t *testing.T) {
	dir := t.TempDir()
	envd := filepath.Join(dir, "envd")
	bin := filepath.Join(dir, "codeinterp")
	os.WriteFile(envd, []byte("envd"), 0o755)
	os.WriteFile(bin, []byte("codeinterp"), 0o755)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	with, err := template.OpenWithOptions(filepath.Join(dir, "a"), envd, template.Options{CodeInterpreter: bin}, log)
	if err != nil {
		t.Fatal(err)
	}
	without, err := template.OpenWithOptions(filepath.Join(dir, "b"), envd, template.Options{}, log)
	if err != nil {
		t.Fatal(err)
	}
	deb := template.BuildRequest{Name: "code-interpreter-v1", Debian: "bookworm", Packages: template.CodeInterpreterPackages, CodeInterpreter: true}
	own := deb
	own.StartCmd = "sleep 1000"
	bb := template.BuildRequest{Name: "ci", Busybox: true, CodeInterpreter: true}
	for _, tt := range []struct {
		name  string
		store *template.Store
		req   template.BuildRequest
		ok    bool
	}{
		{"debian", with, deb, true},
		{"server without the binary", without, deb, false},
		{"own start command", with, own, false},
		{"busybox", with, bb, false},
	} {
		err := tt.store.Validate(tt.req)
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want an ErrInvalid", tt.name, err)
		}
	}
}
