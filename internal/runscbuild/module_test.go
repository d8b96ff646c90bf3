package runscbuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProjectModule: the seccomp generator's temporary module is named as
// the project is, or its copied imports do not resolve (setup fails).
func TestProjectModule(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if first != "module "+projectModule {
		t.Fatalf("go.mod starts %q; projectModule is %q: make them agree", first, projectModule)
	}
}
