package api_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	wire "github.com/agentenv/agentenv/client/api"
)

// wireSchemas maps each wire type to its schema in openapi.yaml, as a JSON
// pointer (request bodies written inline in a path are found there).
var wireSchemas = []struct {
	v      any
	schema string
}{
	{wire.Sandbox{}, "#/components/schemas/Sandbox"},
	{wire.NewSandbox{}, "#/components/schemas/NewSandbox"},
	{wire.ConnectRequest{}, "#/components/schemas/ConnectRequest"},
	{wire.TimeoutRequest{}, "#/components/schemas/TimeoutRequest"},
	{wire.PauseRequest{}, "#/paths/~1sandboxes~1{id}~1pause/post/requestBody/content/application~1json/schema"},
	{wire.ResumeRequest{}, "#/components/schemas/ResumeRequest"},
	{wire.RefreshRequest{}, "#/paths/~1sandboxes~1{id}~1refreshes/post/requestBody/content/application~1json/schema"},
	{wire.NetworkUpdate{}, "#/paths/~1sandboxes~1{id}~1network/put/requestBody/content/application~1json/schema"},
	{wire.SandboxMetric{}, "#/components/schemas/SandboxMetric"},
	{wire.SandboxesMetrics{}, "#/paths/~1sandboxes~1metrics/get/responses/200/content/application~1json/schema"},
	{wire.SnapshotRequest{}, "#/components/schemas/SnapshotRequest"},
	{wire.Snapshot{}, "#/components/schemas/Snapshot"},
	{wire.ForkRequest{}, "#/components/schemas/ForkRequest"},
	{wire.ForkResult{}, "#/components/schemas/ForkResult"},
	{wire.Template{}, "#/components/schemas/Template"},
	{wire.BuildRequest{}, "#/components/schemas/BuildRequest"},
	{wire.BuildProgress{}, "#/components/schemas/BuildProgress"},
	{wire.BuildEvent{}, "#/components/schemas/BuildEvent"},
	{wire.Node{}, "#/components/schemas/Node"},
	{wire.Error{}, "#/components/schemas/Error"},
	{wire.Volume{}, "#/components/schemas/Volume"},
	{wire.VolumeAndToken{}, "#/components/schemas/VolumeAndToken"},
	{wire.NewVolume{}, "#/paths/~1volumes/post/requestBody/content/application~1json/schema"},
	{wire.VolumeEntryStat{}, "#/components/schemas/VolumeEntryStat"},
	{wire.VolumeMetadata{}, "#/paths/~1volumecontent~1{volumeID}~1path/patch/requestBody/content/application~1json/schema"},
	{wire.TemplateBuildRequestV3{}, "#/components/schemas/TemplateBuildRequestV3"},
	{wire.TemplateRequestResponseV3{}, "#/components/schemas/TemplateRequestResponseV3"},
	{wire.TemplateBuildFileUpload{}, "#/components/schemas/TemplateBuildFileUpload"},
	{wire.TemplateBuildStartV2{}, "#/components/schemas/TemplateBuildStartV2"},
	{wire.TemplateBuildInfo{}, "#/components/schemas/TemplateBuildInfo"},
	{wire.TemplateAliasResponse{}, "#/components/schemas/TemplateAliasResponse"},
	{wire.AssignTemplateTagsRequest{}, "#/components/schemas/AssignTemplateTagsRequest"},
	{wire.AssignedTemplateTags{}, "#/components/schemas/AssignedTemplateTags"},
	{wire.DeleteTemplateTagsRequest{}, "#/components/schemas/DeleteTemplateTagsRequest"},
	{wire.TemplateTag{}, "#/components/schemas/TemplateTag"},
	{wire.TemplateBuildLogsResponse{}, "#/components/schemas/TemplateBuildLogsResponse"},
}

// TestWireTypesMatchOpenAPI checks every wire type against its schema:
// each JSON field of the Go type is a property of the schema, and each
// required property is a field. Struct-valued fields are checked against
// the property's own schema, so nested types (Network, Lifecycle...) are
// covered too.
func TestWireTypesMatchOpenAPI(t *testing.T) {
	spec := loadSpec(t)
	seen := map[reflect.Type]bool{}
	for _, w := range wireSchemas {
		typ := reflect.TypeOf(w.v)
		checkSchema(t, spec, "api."+typ.Name(), typ, resolve(t, spec, w.schema), seen)
	}
	// Every struct type of package api must be checked (listed above or
	// reached as a field), so a new one cannot slip past the spec.
	for _, name := range structTypes(t) {
		found := false
		for typ := range seen {
			found = found || typ.Name() == name
		}
		if !found {
			t.Errorf("api.%s is checked against no schema: add it to wireSchemas with its schema's pointer", name)
		}
	}
}

func loadSpec(t *testing.T) any {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	var spec any
	if err := json.Unmarshal(j, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

// resolve follows a JSON pointer ("#/a/b~1c") from the spec's root, and
// then any $ref the node it reaches holds.
func resolve(t *testing.T, spec any, ptr string) map[string]any {
	t.Helper()
	node := spec
	for _, part := range strings.Split(strings.TrimPrefix(ptr, "#/"), "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		m, ok := node.(map[string]any)
		if !ok || m[part] == nil {
			t.Fatalf("openapi.yaml has nothing at %s (stopped at %q)", ptr, part)
		}
		node = m[part]
	}
	m, ok := node.(map[string]any)
	if !ok {
		t.Fatalf("openapi.yaml: %s is not an object", ptr)
	}
	if ref, ok := m["$ref"].(string); ok {
		return resolve(t, spec, ref)
	}
	return m
}

func checkSchema(t *testing.T, spec any, where string, typ reflect.Type, schema map[string]any, seen map[reflect.Type]bool) {
	t.Helper()
	seen[typ] = true
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Anonymous {
			seen[f.Type] = true // checked through its promoted fields
		}
	}
	props, _ := schema["properties"].(map[string]any)
	fields := jsonFields(typ)
	for _, f := range fields {
		if props[f.name] == nil {
			t.Errorf("%s.%s (json %q) is not a property of its schema in openapi.yaml: document it there, or fix the tag", where, f.goName, f.name)
		}
	}
	req, _ := schema["required"].([]any)
	for _, r := range req {
		name, _ := r.(string)
		if !slices.ContainsFunc(fields, func(f field) bool { return f.name == name }) {
			t.Errorf("openapi.yaml requires property %q, which %s has no field for", name, where)
		}
	}
	for _, f := range fields {
		p, ok := props[f.name].(map[string]any)
		if !ok {
			continue
		}
		inner, ps := elemStruct(t, spec, f.typ, p)
		if inner != nil && ps != nil {
			checkSchema(t, spec, where+"."+f.goName, inner, ps, seen)
		}
	}
}

// elemStruct returns the struct type a field holds (through pointers,
// slices and maps) and the matching schema (through $ref, items and
// additionalProperties), or nils for scalars and times.
func elemStruct(t *testing.T, spec any, typ reflect.Type, schema map[string]any) (reflect.Type, map[string]any) {
	for {
		if ref, ok := schema["$ref"].(string); ok {
			schema = resolve(t, spec, ref)
		}
		switch typ.Kind() {
		case reflect.Pointer:
			typ = typ.Elem()
			continue
		case reflect.Slice:
			items, _ := schema["items"].(map[string]any)
			if items == nil {
				return nil, nil
			}
			typ, schema = typ.Elem(), items
			continue
		case reflect.Map:
			ap, _ := schema["additionalProperties"].(map[string]any)
			if ap == nil {
				return nil, nil
			}
			typ, schema = typ.Elem(), ap
			continue
		case reflect.Struct:
			if typ == reflect.TypeOf(time.Time{}) {
				return nil, nil
			}
			return typ, schema
		}
		return nil, nil
	}
}

type field struct {
	name, goName string
	typ          reflect.Type
}

// jsonFields lists the JSON fields of a struct as encoding/json sees them
// (embedded structs' fields promoted, "-" left out).
func jsonFields(typ reflect.Type) []field {
	var out []field
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name: name, goName: f.Name, typ: f.Type})
	}
	return out
}

// structTypes lists the struct types declared in package api's source
// (client/api).
func structTypes(t *testing.T) []string {
	t.Helper()
	pkgs, err := parser.ParseDir(token.NewFileSet(), "../../client/api", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok {
					continue
				}
				for _, s := range g.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					if _, isStruct := ts.Type.(*ast.StructType); isStruct && ts.Name.IsExported() {
						out = append(out, ts.Name.Name)
					}
				}
			}
		}
	}
	return out
}
