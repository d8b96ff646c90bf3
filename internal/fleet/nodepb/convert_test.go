package nodepb_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// TestTemplateCrosses: a template crosses the node service whole, its
// sandboxes' CPUs and memory (E2B's cpuCount and memoryMB) included.
func TestTemplateCrosses(t *testing.T) {
	in := service.TemplateInfo{Ready: true, Template: template.Template{
		Name: "big", Source: "debian:bookworm", Packages: []string{"python3"}, CreatedAt: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC),
		ImageSize: 123 << 20, EnvdHash: "abc",
		Defaults: template.Defaults{Env: map[string]string{"A": "1"}, Workdir: "/app", User: "user"},
		Start:    template.Start{StartCmd: "serve", ReadyCmd: "true", ReadyTimeout: 30},
		DiskMB:   2048, Owner: "alice", Size: template.Size{CPUs: 2, MemoryMB: 1024}, InUse: 3,
		OwnBytes: 1 << 20, SharedBytes: 600 << 20, Lowers: []string{strings.Repeat("ab", 32)},
	}}
	if got := nodepb.ToTemplate(nodepb.FromTemplate(in)); !reflect.DeepEqual(got, in) {
		t.Errorf("after the node service:\n got %+v\nwant %+v", got, in)
	}
}
