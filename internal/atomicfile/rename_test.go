package atomicfile

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// renameAllowed lists the functions outside this package that may rename
// without it ("file:Func", methods as "file:Type.Func"), each with why.
// Anything that writes a record (a file read back to recover state) goes
// through WriteFile, Write or Rename instead.
var renameAllowed = map[string]string{
	"internal/envd/filesystem.go:filesystemService.Move": "the sandbox user's own move of their files (E2B's Move call), not agentenv's state",
	"internal/imagebuild/layer.go:Builder.commit":        "renames a layer directory into the build cache",
	"internal/imagebuild/layer.go:Builder.trashLocked":   "moves a cache directory aside to remove it",
	"internal/template/build.go:Store.Build":             "swaps a template's directory for the new build's",
	"internal/template/build.go:Store.takeTree":          "moves a prepared rootfs directory into the template",
	"internal/template/copy.go:Store.Adopt":              "moves a copied template's staging directory into the store",
	"internal/template/thin.go:Store.prepareThin":        "swaps a thin build's tree of changes for the whole merged root (a directory) when the template must be flat",
	"internal/snapshot/add.go:Store.commit": "moves a chunk of checkpoint data (megabytes, content-addressed) into the store; " +
		"syncing it would add about 35 ms per 64 MiB to every snapshot; the manifest naming it is written with WriteFile",
	"internal/snapshot/snapshot.go:Store.load": "moves a blob of the old store layout to its chunk name (bulk data already on disk); " +
		"the manifest rewritten after it goes through WriteFile",
}

// TestNoRenameOutsideHelper scans every non-test Go file of the repository
// for a rename (os.Rename, syscall/unix Rename*) and fails on one that is
// neither in this package nor allowed above, so state is written one way.
func TestNoRenameOutsideHelper(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{} // allow-list key -> positions
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "vendor" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if filepath.ToSlash(filepath.Dir(rel)) == "internal/atomicfile" {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, call := range renames(f) {
			key := rel + ":" + call.fn
			found[key] = append(found[key], fset.Position(call.pos).String())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range found {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	n := 0
	for _, k := range keys {
		n += len(found[k])
		if _, ok := renameAllowed[k]; !ok {
			t.Errorf("%s renames outside internal/atomicfile: write the file with atomicfile.WriteFile/Write/Rename, or allow it in renameAllowed saying why", strings.Join(found[k], ", "))
		}
	}
	for k := range renameAllowed {
		if _, ok := found[k]; !ok {
			t.Errorf("renameAllowed names %s, which no longer renames: drop it", k)
		}
	}
	t.Logf("%d rename calls outside internal/atomicfile, in %d functions", n, len(keys))
}

type renameCall struct {
	fn  string
	pos token.Pos
}

// renames returns the rename calls of f with the function each is in.
func renames(f *ast.File) []renameCall {
	pkgs := map[string]string{} // local name -> import path
	for _, im := range f.Imports {
		path, _ := strconv.Unquote(im.Path.Value)
		name := path[strings.LastIndex(path, "/")+1:]
		if im.Name != nil {
			name = im.Name.Name
		}
		pkgs[name] = path
	}
	var out []renameCall
	for _, decl := range f.Decls {
		fn := "(package level)"
		if fd, ok := decl.(*ast.FuncDecl); ok {
			fn = fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				fn = recvName(fd.Recv.List[0].Type) + "." + fn
			}
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch pkgs[x.Name] {
			case "os", "syscall", "golang.org/x/sys/unix":
				if strings.HasPrefix(sel.Sel.Name, "Rename") {
					out = append(out, renameCall{fn, call.Pos()})
				}
			}
			return true
		})
	}
	return out
}

func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}
