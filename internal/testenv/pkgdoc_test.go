package testenv_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// TestPackageDocs checks that every package under internal/ and cmd/ says
// what it is for in a package comment. Generated code is exempt.
func TestPackageDocs(t *testing.T) {
	root := testenv.RepoRoot()
	var exempt []string // generated code: envd's is in api/, outside the walk
	checked := 0
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			for _, e := range exempt {
				if rel == e || strings.HasPrefix(rel, e+string(filepath.Separator)) {
					return filepath.SkipDir
				}
			}
			if name := d.Name(); name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
				return filepath.SkipDir
			}
			hasGo, documented, err := packageDoc(path)
			if err != nil {
				t.Errorf("%s: %v", rel, err)
				return nil
			}
			if !hasGo {
				return nil
			}
			checked++
			if !documented {
				t.Errorf("package %s has no package doc comment: add one (\"// Package x ...\", or \"// Command x ...\" for a main package) saying what it is for and what it must not do", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if checked < 5 {
		t.Fatalf("checked only %d packages under %s: is RepoRoot right?", checked, root)
	}
}

// packageDoc reports whether dir holds non-test Go files and whether one of
// them carries the package comment.
func packageDoc(dir string) (hasGo, documented bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, false, err
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		hasGo = true
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return hasGo, false, err
		}
		if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
			documented = true
		}
	}
	return hasGo, documented, nil
}
