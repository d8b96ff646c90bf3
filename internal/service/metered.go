package service

import (
	"context"
	"errors"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// Metered wraps a Backend so that every operation that changes a sandbox
// is counted in flight and reports its latency and error to reg
// (Prometheus, in every role).
func Metered(b Backend, reg *metrics.Registry) Backend {
	return &metered{Backend: b, reg: reg}
}

type metered struct {
	Backend
	reg *metrics.Registry
}

func timed[T any](m *metered, op string, f func() (T, error)) (v T, err error) {
	done := m.reg.Begin(op)
	defer func() { done(err) }() // also when f panics: in flight must not leak
	return f()
}

func (m *metered) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	return timed(m, "create", func() (sandbox.Sandbox, error) { return m.Backend.Create(ctx, req) })
}

// Kill does not count a kill of a sandbox that does not exist (any more)
// as a failed kill: E2B's SDKs kill what may have ended already, and read
// the 404 as "it is gone", which is what the kill was for.
func (m *metered) Kill(ctx context.Context, id string) error {
	var err error
	timed(m, "kill", func() (struct{}, error) {
		if err = m.Backend.Kill(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			return struct{}{}, nil
		}
		return struct{}{}, err
	})
	return err
}

func (m *metered) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return timed(m, "pause", func() (sandbox.Sandbox, error) { return m.Backend.Pause(ctx, id) })
}

// PauseFiles passes through to a backend that has it.
func (m *metered) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	fp, ok := m.Backend.(FilesPauser)
	if !ok {
		return sandbox.Sandbox{}, errdefs.Invalid("pause with memory: false is not available on this server (fleet mode): pause with memory")
	}
	return timed(m, "pause", func() (sandbox.Sandbox, error) { return fp.PauseFiles(ctx, id) })
}

func (m *metered) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return timed(m, "resume", func() (sandbox.Sandbox, error) { return m.Backend.Resume(ctx, id, d) })
}

// Connect counts as a resume when it resumed (or failed), as the resume
// it replaces did.
func (m *metered) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	start := time.Now()
	sb, resumed, err := m.Backend.Connect(ctx, id, d)
	if resumed || err != nil {
		m.reg.ObserveOp(metrics.OpResume, time.Since(start), err)
	}
	return sb, resumed, err
}

func (m *metered) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return timed(m, "snapshot", func() (snapshot.Snapshot, error) { return m.Backend.Snapshot(ctx, id, req) })
}

func (m *metered) Fork(ctx context.Context, id string, count int, d time.Duration, md map[string]string) ([]sandbox.ForkResult, error) {
	return timed(m, "fork", func() ([]sandbox.ForkResult, error) { return m.Backend.Fork(ctx, id, count, d, md) })
}

func (m *metered) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (TemplateInfo, error) {
	return timed(m, "template_build", func() (TemplateInfo, error) { return m.Backend.BuildTemplate(ctx, req, progress) })
}
