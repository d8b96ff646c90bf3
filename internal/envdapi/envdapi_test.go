package envdapi_test

import (
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestImportsNothing keeps the package free of imports: envd's early
// listener imports it, and every package it imported would initialize
// before the listener opens envd's socket.
func TestImportsNothing(t *testing.T) {
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			t.Errorf("%s imports %s: envdapi holds constants only and imports nothing", e.Name(), im.Path.Value)
		}
	}
}
