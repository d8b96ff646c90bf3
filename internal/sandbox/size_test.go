package sandbox

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestTemplateSize: a create that names no CPUs or memory gets its
// template's (E2B's build cpuCount/memoryMB), capped by the server's
// maximum; a template without a size, or no template, gets the defaults;
// a request's own values win.
func TestTemplateSize(t *testing.T) {
	testenv.NeedCommand(t, "mkfs.erofs", "builds the test templates' images")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	envd := filepath.Join(t.TempDir(), "envd")
	os.WriteFile(envd, []byte("envd"), 0o755)
	store, err := template.Open(t.TempDir(), envd, log)
	if err != nil {
		t.Fatal(err)
	}
	for name, size := range map[string]template.Size{
		"plain": {}, "big": {CPUs: 1, MemoryMB: 1024}, "huge": {CPUs: 64, MemoryMB: 1 << 20},
	} {
		if _, err := store.Build(t.Context(), template.BuildRequest{Name: name, Busybox: true, Size: size}, func(template.Progress) {}); err != nil {
			t.Fatalf("build %s: %v", name, err)
		}
	}
	if _, err := store.Build(t.Context(), template.BuildRequest{Name: "tiny", Busybox: true, Size: template.Size{MemoryMB: 8}}, func(template.Progress) {}); err == nil {
		t.Error("a template of 8 MiB was built, want it refused (at least 64)")
	}
	l := DefaultLimits()
	m, err := New(Deps{Dir: t.TempDir(), Runtime: newFakeRuntime(), Templates: store, Limits: l, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		template          string
		cpus, mem         int
		wantCPUs, wantMem int
	}{
		{"plain", 0, 0, l.DefaultCPUs, l.DefaultMemMB},
		{"missing", 0, 0, l.DefaultCPUs, l.DefaultMemMB},
		{"big", 0, 0, 1, 1024},
		{"big", 0, 768, 1, 768},
		{"big", 4, 0, 4, 1024},
		{"huge", 0, 0, l.MaxCPUs, l.MaxMemMB},
	} {
		req := CreateRequest{Template: tc.template, CPUs: tc.cpus, MemoryMB: tc.mem}
		m.size.fill(&req)
		if req.CPUs != tc.wantCPUs || req.MemoryMB != tc.wantMem {
			t.Errorf("%s asking for %d CPUs, %d MiB: got %d, %d; want %d, %d", tc.template, tc.cpus, tc.mem, req.CPUs, req.MemoryMB, tc.wantCPUs, tc.wantMem)
		}
		if err := l.check(&req); err != nil {
			t.Errorf("%s: the sized request is refused: %v", tc.template, err)
		}
	}
	// A template's size survives the store's reopening (template.json).
	again, err := template.Open(store.Dir(), envd, log)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Get("big"); err != nil || got.Size != (template.Size{CPUs: 1, MemoryMB: 1024}) {
		t.Errorf("reopened store: template big has size %+v (%v), want 1 CPU, 1024 MiB", got.Size, err)
	}
}
