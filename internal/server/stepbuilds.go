package server

import (
	"context"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/template"
)

// StepBuilds are the operator's choices for E2B's template-in-code builds
// (POST /v3/templates and after).
type StepBuilds struct {
	// RegistryAllow are registry hosts (host[:port]) fromImage may pull
	// from although they resolve to loopback, private or link-local
	// addresses (--registry-allow).
	RegistryAllow []string
	// RegistryMirror pulls Docker Hub references through this registry
	// (--registry-mirror).
	RegistryMirror string
	// MaxUploadMB caps one COPY step's uploaded archive (0: 2 GiB).
	MaxUploadMB int64
	// MaxConcurrent is how many builds run at once (0: 2).
	MaxConcurrent int
	// Sandbox bounds every build sandbox: CPUs and memory of a build that
	// asks for none, and the process cap (zero fields: imagebuild's
	// defaults; the most CPUs and memory a build may ask for are the
	// sandboxes' maximums).
	Sandbox imagebuild.Limits
	// LogMB bounds one build's log and LogsTotalMB all builds' logs
	// together, in memory (0: the API's defaults).
	LogMB, LogsTotalMB int64
}

// newStepBuilds makes the template-in-code build service of h: the step
// builder (its cache in <data-dir>/build, on the template store's
// filesystem) and the uploads of COPY steps (<data-dir>/template-files).
// Build sandboxes get a network slot with the default egress policy;
// none with --network none. Without root (the unprivileged test tier)
// the routes answer 503.
func newStepBuilds(cfg Config, h *Host) (*api.TemplateBuilds, error) {
	bc := api.TemplateBuildsConfig{FilesDir: filepath.Join(cfg.DataDir, "template-files"),
		MaxUploadBytes: cfg.StepBuilds.MaxUploadMB << 20, MaxConcurrent: cfg.StepBuilds.MaxConcurrent,
		MaxLogBytes: cfg.StepBuilds.LogMB << 20, MaxLogBytesTotal: cfg.StepBuilds.LogsTotalMB << 20, Log: cfg.Log, Meter: h.Disk.Opener()}
	h.Disk.AddSource(sandbox.DiskSource{Name: "uploaded build files", Bytes: func() int64 { return template.DiskUsage(bc.FilesDir) }})
	if !cfg.unprivileged() {
		var network func(ctx context.Context) (string, func(), error)
		if cfg.Network != "none" {
			network = h.Manager.BuildNetwork
		}
		limits := cfg.StepBuilds.Sandbox
		if limits.MaxMemoryMB == 0 {
			limits.MaxMemoryMB = max(cfg.Limits.MaxMemMB, limits.MemoryMB)
		}
		if limits.MaxCPUs == 0 {
			limits.MaxCPUs = max(cfg.Limits.MaxCPUs, limits.CPUs)
		}
		b, err := imagebuild.New(imagebuild.Config{Dir: filepath.Join(cfg.DataDir, "build"), Runsc: cfg.Runsc, Templates: h.Templates,
			Network: network, Registries: cfg.StepBuilds.RegistryAllow, Mirror: cfg.StepBuilds.RegistryMirror, Limits: limits, Log: cfg.Log, Meter: h.Disk.Opener(),
			ThinLayers: h.StacksLayers})
		if err != nil {
			return nil, err
		}
		h.Disk.AddSource(sandbox.DiskSource{Name: "build cache", Bytes: b.DiskBytes})
		bc.Steps = b
	}
	return api.NewTemplateBuilds(bc)
}
