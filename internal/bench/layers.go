package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/client/api"
)

// The layers rows: a template of one 1 MiB file built on the bench's
// template (its base phase cached by a first build), the time from the
// build's start until it is ready, the disk the template adds (its own
// bytes: a thin template stores only its changes), and creates from it
// beside creates from the base, taking turns.
const layersFileMiB = 1

// layers builds HeavyIterations one-file templates, then measures creates.
func (r *runner) layers(ctx context.Context) (err error) {
	a := r.ts.agentenv
	base := a.template
	r.progressf("layers: %d builds of a %d MiB file on template %s", r.cfg.HeavyIterations, layersFileMiB, base)
	var names []string
	defer func() {
		for _, n := range names {
			if derr := r.cfg.Client.DeleteTemplate(context.WithoutCancel(ctx), n); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete template %s: %w", n, derr))
			}
		}
	}()
	var own []int64
	var last client.Template
	for i := -1; i < r.cfg.HeavyIterations; i++ {
		name := fmt.Sprintf("bench-layer-%s-%d", a.run, i+1)
		start := time.Now()
		t, err := r.cfg.Client.BuildSteps(ctx, name, api.TemplateBuildStartV2{FromTemplate: base, Steps: []api.TemplateStep{
			{Type: "RUN", Args: []string{fmt.Sprintf("mkdir -p /task && head -c %d /dev/urandom > /task/task.py # %s", layersFileMiB<<20, name), "root"}},
		}})
		if err != nil {
			return err
		}
		names = append(names, name)
		if i < 0 {
			continue // the base phase's layer, cached for the others
		}
		r.add(TargetAgentenv, map[Operation]time.Duration{OpLayerBuild: time.Since(start)})
		own = append(own, t.OwnBytes)
		last = t
	}
	r.setStorage(TargetAgentenv, OpLayerBytes, own)
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("layers: templates of one %d MiB file (a RUN step) on %s: %d layer(s), shared bytes %.1f MiB", layersFileMiB, base, max(last.Layers, 1), float64(last.SharedBytes)/(1<<20)))
	thin := newAgentenvTarget(r.cfg.Client, last.TemplateID)
	defer func() { err = errors.Join(err, thin.close(context.WithoutCancel(ctx))) }()
	timed := func(t *agentenvTarget, op Operation) step {
		return step{TargetAgentenv, func(ctx context.Context) (map[Operation]time.Duration, error) {
			start := time.Now()
			id, err := t.create(ctx)
			if err != nil {
				return nil, fmt.Errorf("create from %s: %w", t.template, err)
			}
			d := time.Since(start)
			if err := t.kill(ctx, id); err != nil {
				return nil, err
			}
			return map[Operation]time.Duration{op: d}, nil
		}}
	}
	return r.rounds(ctx, "layers: create from the one-file template and from its base", r.cfg.Iterations, r.cfg.Warmup,
		[]step{timed(thin, OpLayerCreate), timed(a, OpLayerBaseCreate)})
}
