package api

import (
	"bufio"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// openapiPath is the REST API's description, relative to this package.
const openapiPath = "../../api/openapi.yaml"

// openapiMethods are the operation keys of an OpenAPI path item.
var openapiMethods = map[string]bool{
	"get": true, "put": true, "post": true, "delete": true,
	"options": true, "head": true, "patch": true, "trace": true,
}

// openapiPattern matches a method-qualified net/http pattern ("GET /x/{id}").
var openapiPattern = regexp.MustCompile(`^(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS|CONNECT|TRACE) (/\S*)$`)

// openapiSpecPath is one path item of openapi.yaml.
type openapiSpecPath struct {
	methods []string // upper case
	// proxy is true when the path item has its own servers entry: it is
	// served on the proxy port (proxy or envd), not by this package.
	proxy bool
}

// readOpenAPIPaths scans the paths section of openapi.yaml line by line
// (go.mod has no YAML parser, and the section's shape is simple): path keys
// one level under "paths:", operation and "servers" keys one level under
// each path.
func readOpenAPIPaths(t *testing.T) map[string]*openapiSpecPath {
	t.Helper()
	f, err := os.Open(openapiPath)
	if err != nil {
		t.Fatalf("open %s: %v", openapiPath, err)
	}
	defer f.Close()
	paths := map[string]*openapiSpecPath{}
	inPaths := false
	pathIndent, opIndent := -1, -1
	var cur *openapiSpecPath
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), " \r")
		trimmed := strings.TrimLeft(line, " ")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		indent := len(line) - len(trimmed)
		if indent == 0 {
			inPaths = trimmed == "paths:"
			cur = nil
			continue
		}
		if !inPaths {
			continue
		}
		if pathIndent < 0 {
			pathIndent = indent
		}
		key, rest, ok := strings.Cut(trimmed, ":")
		if indent == pathIndent {
			if !ok {
				t.Fatalf("%s:%d: want a path key, got %q", openapiPath, n, trimmed)
			}
			key = strings.Trim(key, `'"`)
			if !strings.HasPrefix(key, "/") {
				t.Fatalf("%s:%d: path key %q does not start with /", openapiPath, n, key)
			}
			if strings.TrimSpace(rest) != "" {
				t.Fatalf("%s:%d: write path item %q in block style (this test scans lines)", openapiPath, n, key)
			}
			if paths[key] != nil {
				t.Fatalf("%s:%d: path %q appears twice", openapiPath, n, key)
			}
			cur = &openapiSpecPath{}
			paths[key] = cur
			continue
		}
		if indent < pathIndent || cur == nil {
			t.Fatalf("%s:%d: unexpected indentation in paths section: %q", openapiPath, n, line)
		}
		if opIndent < 0 {
			opIndent = indent
		}
		if indent != opIndent || !ok {
			continue
		}
		key = strings.Trim(key, `'"`)
		switch {
		case openapiMethods[key]:
			cur.methods = append(cur.methods, strings.ToUpper(key))
		case key == "servers":
			cur.proxy = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read %s: %v", openapiPath, err)
	}
	if len(paths) == 0 {
		t.Fatalf("%s: found no paths section", openapiPath)
	}
	return paths
}

// specRoutes returns the REST API's operations in openapi.yaml as
// net/http patterns ("GET /sandboxes/{id}").
func specRoutes(paths map[string]*openapiSpecPath) map[string]bool {
	out := map[string]bool{}
	for p, item := range paths {
		if item.proxy {
			continue
		}
		for _, m := range item.methods {
			out[m+" "+p] = true
		}
	}
	return out
}

// sourceRoutes reads the method-qualified patterns registered in this
// package's (non-test) source: every call whose first argument is a string
// literal such as "GET /sandboxes" (mux.Handle, mux.HandleFunc and helpers
// like auth alike). Parsing the source keeps the test free of root, gVisor
// and any change to api.go.
func sourceRoutes(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if openapiPattern.MatchString(s) {
				out[s] = true
				return true
			}
			// A pattern without a method would serve every method: the
			// spec could not describe it; only the catch-all "/" may do so.
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Handle" || sel.Sel.Name == "HandleFunc") && strings.HasPrefix(s, "/") && s != "/" {
				t.Errorf("%s: pattern %q has no method; register it as \"GET %s\" (or another method) and document it in %s", fset.Position(lit.Pos()), s, s, openapiPath)
			}
			return true
		})
	}
	if len(out) == 0 {
		t.Fatalf("found no route patterns in this package's source: has route registration moved? update sourceRoutes")
	}
	return out
}

// probeRoute sends method and a concrete form of path to the handler and
// returns the pattern ServeMux matched ("/" is the catch-all 404). No API
// key is sent, so no route handler runs (they would need a sandbox manager
// and template store): the mux records the pattern before auth answers 401.
func probeRoute(h http.Handler, method, path string) (pattern string) {
	concrete := regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(path, "zz-probe")
	req := httptest.NewRequest(method, concrete, nil)
	defer func() {
		recover() // a handler that ran anyway still leaves req.Pattern set
		pattern = req.Pattern
	}()
	h.ServeHTTP(httptest.NewRecorder(), req)
	return req.Pattern
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIMatchesRoutes fails when a route registered in Handler() is
// missing from api/openapi.yaml, or the yaml documents a REST route that
// Handler() does not serve.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	paths := readOpenAPIPaths(t)
	spec := specRoutes(paths)
	src := sourceRoutes(t)
	h := New(Config{APIKey: "openapi-test-key"}).Handler()

	// Source patterns must be real routes (guards the source scan).
	served := map[string]bool{}
	for _, r := range sortedKeys(src) {
		m := openapiPattern.FindStringSubmatch(r)
		if got := probeRoute(h, m[1], m[2]); got != r {
			t.Errorf("source pattern %q: a %s request is routed to %q, not to it", r, m[1], got)
			continue
		}
		served[r] = true
	}

	// Every documented REST operation must reach its own route.
	for _, r := range sortedKeys(spec) {
		method, path, _ := strings.Cut(r, " ")
		if got := probeRoute(h, method, path); got != r {
			t.Errorf("%s documents %s %s, but Handler() routes it to %q (not served; remove it from the yaml or register it)", openapiPath, method, path, got)
		}
	}

	// Every registered route must be documented (as a REST path, i.e. a
	// path item without its own servers entry).
	for _, r := range sortedKeys(served) {
		if spec[r] {
			continue
		}
		_, path, _ := strings.Cut(r, " ")
		if item := paths[path]; item != nil && item.proxy {
			t.Errorf("Handler() serves %q, but %s documents path %s as a proxy-port path (it has a path-level servers entry)", r, openapiPath, path)
			continue
		}
		t.Errorf("Handler() serves %q, but %s does not document it: add it under paths", r, openapiPath)
	}

	// Any method on any documented path (proxy ones included) must either
	// fall through to the catch-all or land on a documented REST route.
	// This catches routes the source scan would miss.
	methods := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
	for _, p := range sortedKeysOf(paths) {
		for _, m := range methods {
			got := probeRoute(h, m, p)
			if got == "" {
				t.Errorf("%s %s: the handler matched no pattern at all (is the catch-all gone?)", m, p)
				continue
			}
			if got == "/" || spec[got] {
				continue
			}
			t.Errorf("%s %s is served by pattern %q, which %s does not document", m, p, got, openapiPath)
		}
	}

	// The catch-all must still answer unknown routes (the probes above
	// rely on it).
	if got := probeRoute(h, "GET", "/no/such/route/zz-probe"); got != "/" {
		t.Errorf("GET of an unknown path matched %q, want the catch-all \"/\"", got)
	}
}

func sortedKeysOf(m map[string]*openapiSpecPath) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIErrorCodes checks that the Error schema's error_code enum lists
// exactly the classes errdefs maps errors to.
func TestOpenAPIErrorCodes(t *testing.T) {
	want := map[string]bool{}
	for _, err := range []error{
		errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrConflict, errdefs.ErrUnavailable,
		errdefs.ErrResourceExhausted, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrTooLarge, errdefs.ErrInsufficientStorage,
		errors.New("no class"),
	} {
		_, code := errdefs.HTTPStatus(err)
		want[code] = true
	}
	data, err := os.ReadFile(openapiPath)
	if err != nil {
		t.Fatal(err)
	}
	// Find "error_code:" and the first "enum: [...]" after it.
	text := string(data)
	i := strings.Index(text, "\n        error_code:\n")
	if i < 0 {
		t.Fatalf("%s: no error_code property found", openapiPath)
	}
	m := regexp.MustCompile(`enum: \[([^\]]*)\]`).FindStringSubmatch(text[i:])
	if m == nil {
		t.Fatalf("%s: error_code has no enum", openapiPath)
	}
	got := map[string]bool{}
	for _, c := range strings.Split(m[1], ",") {
		got[strings.Trim(strings.TrimSpace(c), `'"`)] = true
	}
	for _, c := range sortedKeys(want) {
		if !got[c] {
			t.Errorf("%s: error_code enum lacks %q", openapiPath, c)
		}
	}
	for _, c := range sortedKeys(got) {
		if !want[c] {
			t.Errorf("%s: error_code enum lists %q, which errdefs never produces", openapiPath, c)
		}
	}
}
