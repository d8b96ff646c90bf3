package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	wire "github.com/agentenv/agentenv/client/api"
)

// Without a terminal (a log, a pipe), `template build` writes one line per
// phase, not a bar redrawn for every event: a Debian build sends hundreds
// of events, and each redraw used to be a line of the demo's log.
func TestTemplateBuildProgressWithoutTerminal(t *testing.T) {
	phases := []string{"download", "unpack", "configure", "image", "done"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/agentenv/templates" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for i, ph := range phases {
			for j := range 60 {
				enc.Encode(wire.BuildEvent{Progress: &wire.BuildProgress{Phase: ph, Percent: float64(i*20 + j/3), Message: fmt.Sprintf("package-%d", j)}})
			}
		}
		enc.Encode(wire.BuildEvent{Template: &wire.Template{TemplateID: "base", Source: "debian:bookworm"}})
	}))
	defer srv.Close()

	root := Root()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"--server", srv.URL, "--api-key", "k", "template", "build", "base", "--debian", "bookworm"})
	if err := root.Execute(); err != nil {
		t.Fatalf("template build: %v\nstderr:\n%s", err, errOut.String())
	}
	if strings.ContainsAny(errOut.String(), "\r\x1b") {
		t.Errorf("stderr holds carriage returns or escape sequences (a bar's redraws):\n%q", errOut.String())
	}
	lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
	if len(lines) != len(phases) {
		t.Fatalf("got %d lines of progress, want %d (one per phase):\n%s", len(lines), len(phases), errOut.String())
	}
	for i, ph := range phases {
		if want := "building base: " + ph + " ("; !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %q, want it to start with %q", i+1, lines[i], want)
		}
	}
	if !strings.HasPrefix(out.String(), "built template base") {
		t.Errorf("stdout = %q, want the result line", out.String())
	}
}
