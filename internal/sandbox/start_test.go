package sandbox

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
)

// TestTemplateProcess: a sandbox's spec holds the template's environment
// under the sandbox's own (each key once; the image's PATH replaces the
// default one; agentenv's own variables stay) and envd's default user and
// working directory flags.
func TestTemplateProcess(t *testing.T) {
	dir := t.TempDir()
	envd := filepath.Join(dir, "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	tpl := template.Template{Name: "img", Defaults: template.Defaults{
		Env: map[string]string{"PATH": "/opt/bin", "LANG": "C.UTF-8", "MODE": "template"}, Workdir: "/srv", User: "app"}}
	b, _ := json.Marshal(tpl)
	os.MkdirAll(filepath.Join(dir, "templates", "img"), 0o755)
	os.WriteFile(filepath.Join(dir, "templates", "img", "template.json"), b, 0o644)
	store, err := template.Open(filepath.Join(dir, "templates"), envd, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{d: Deps{Templates: store}}
	sb := Sandbox{Template: "img", EnvVars: map[string]string{"MODE": "sandbox", "EXTRA": "1"}}
	env, args := m.templateProcess(sb, []string{"PATH=/usr/bin:/bin", "E2B_SANDBOX=true"})
	if want := []string{"PATH=/opt/bin", "E2B_SANDBOX=true", "EXTRA=1", "LANG=C.UTF-8", "MODE=sandbox"}; !slices.Equal(env, want) {
		t.Errorf("env = %q, want %q", env, want)
	}
	if want := []string{template.EnvdPath, "-user", "app", "-workdir", "/srv"}; !slices.Equal(args, want) {
		t.Errorf("args = %q, want %q", args, want)
	}
	// A sandbox's variable cannot unset or replace a default (envd's
	// access token is one).
	sb.EnvVars["AGENTENV_ENVD_ACCESS_TOKEN"] = "attacker"
	env, _ = m.templateProcess(sb, []string{"PATH=/usr/bin:/bin", "AGENTENV_ENVD_ACCESS_TOKEN=secret"})
	if !slices.Contains(env, "AGENTENV_ENVD_ACCESS_TOKEN=secret") || slices.Contains(env, "AGENTENV_ENVD_ACCESS_TOKEN=attacker") {
		t.Errorf("env = %q, want the default access token kept and the sandbox's ignored", env)
	}
	// A template without settings: envd alone, the base env as it was.
	env, args = m.templateProcess(Sandbox{Template: "busybox"}, []string{"PATH=/bin"})
	if !slices.Equal(env, []string{"PATH=/bin"}) || !slices.Equal(args, []string{template.EnvdPath}) {
		t.Errorf("plain template: env %q args %q", env, args)
	}
}

// TestPreparing: marks nest and are safe to take and drop concurrently;
// the template is preparing until the last is dropped.
func TestPreparing(t *testing.T) {
	m := &Manager{}
	outer := m.Preparing("t")
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := m.Preparing("t")
			_ = m.prep.has("t")
			done()
			done() // a second call is a no-op
		}()
	}
	wg.Wait()
	if !m.prep.has("t") {
		t.Fatal("not preparing while the outer mark is held")
	}
	outer()
	if m.prep.has("t") {
		t.Fatal("still preparing after every mark was dropped")
	}
}
