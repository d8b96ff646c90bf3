// Package bench measures agentenv's sandbox operations against a running
// server (create, exec, files, kill, pause/resume, snapshot, restore, fork,
// churn at several levels of parallelism, memory per sandbox, HTTP through
// the proxy, and on request the density of a thousand idle sandboxes with the
// host limits they approach) and, in the same run, the same work done with
// the raw runsc CLI and, where it has an equivalent, with crun, and prints
// the result as tables.
//
// It is a measuring tool, not a test: it asserts nothing about speed. It
// must leave nothing behind (containers, sandboxes, mounts, temp dirs), also
// when a step fails or the context is cancelled (Ctrl-C).
package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/client"
)

// Config says what to measure.
type Config struct {
	// Client reaches the agentenv server under test; not used with Serve.
	Client *client.Client
	// Template is the agentenv template sandboxes are created from.
	Template string
	// Iterations is the number of measured samples per target of the light
	// rows: create/exec/file/kill cycles, pause/resume, idle snapshot,
	// restore.
	Iterations int
	// Warmup samples of the light rows run before the measured ones and are
	// not counted: the first pays for cold page cache and connection setup.
	Warmup int
	// HeavyIterations is the number of samples per target of the heavy
	// rows: dirty snapshots, fork 4 and fork 16 (no warm-up).
	HeavyIterations int
	// ChurnDuration is how long each target's churn runs at each level.
	ChurnDuration time.Duration
	// ChurnLevels are the numbers of create+exec+kill cycles churn keeps
	// going at once, one run per level and target.
	ChurnLevels []int
	// ChurnInFlight picks the level the main table's churn row shows; when
	// it is not one of ChurnLevels, the highest level is shown.
	ChurnInFlight int
	// Density is the number of idle sandboxes, and of fork children, the
	// memory rows measure at once.
	Density int
	// DensitySandboxes is how many idle sandboxes the density group starts
	// per target.
	DensitySandboxes int
	// DensityParallel is how many of those creates run at once.
	DensityParallel int
	// CPURounds is the number of batches per target of each CPU row;
	// CPUOps the operations in one batch.
	CPURounds int
	CPUOps    int
	// RolloutLevels are the numbers of agents the rollout group runs in
	// parallel, one run per level and target, for RolloutDuration each.
	RolloutLevels   []int
	RolloutDuration time.Duration
	// Serve, when its Binary is set, makes Run start its own server (and
	// count its CPU) instead of using Client.
	Serve ServeOptions
	// SandboxFusionURL is the SandboxFusion service the rl group calls
	// (http://HOST:PORT); with Serve the bench starts its server with one.
	SandboxFusionURL string
	// HostPython is the python3 the rl group runs on the host (default
	// /usr/bin/python3, the distribution's: a version manager's shim
	// first on PATH would add its own start-up to the floor).
	HostPython string
	// Only, when not empty, limits the run to these groups (see Groups).
	Only map[string]bool
	// SkipRaw measures agentenv only (no runsc, no crun; no root needed).
	SkipRaw bool
	// Runsc is the runsc binary for the raw comparison.
	Runsc string
	// Crun is the crun binary for the raw comparison.
	Crun string
	// Busybox is the static busybox binary the raw rootfs is made from.
	Busybox string
	// Progress, when not nil, receives one line per phase.
	Progress io.Writer
}

func (c Config) runs(group string) bool {
	if len(c.Only) == 0 {
		return slices.Contains(DefaultGroups, group)
	}
	return c.Only[group]
}

// Target names.
const (
	TargetAgentenv = "agentenv"
	TargetRunsc    = "runsc"
	TargetCrun     = "crun"
)

// PayloadSize is the size of the file written and read back.
const PayloadSize = 1 << 20

// Report is the outcome of a run.
type Report struct {
	Template        string  `json:"template"`
	Iterations      int     `json:"iterations"`
	Warmup          int     `json:"warmup"`
	HeavyIterations int     `json:"heavy_iterations"`
	ChurnSeconds    float64 `json:"churn_seconds"`
	ChurnLevels     []int   `json:"churn_levels,omitempty"`
	// ChurnInFlight is the level of Churn (the main table's row).
	ChurnInFlight int `json:"churn_in_flight"`
	// Density is the number of sandboxes the memory rows measure at once.
	Density int `json:"density"`
	// ReadyTemplate says that the server creates sandboxes of Template by
	// restoring a snapshot of it booted once (a ready template) rather than
	// by booting: the create row then measures that path.
	ReadyTemplate bool `json:"ready_template"`
	// Targets are the measured targets in column order.
	Targets []string `json:"targets"`
	// Stats holds, per target and timed operation, the summary of its
	// samples.
	Stats map[string]map[Operation]Stats `json:"stats"`
	// Churn holds, per target, the create+exec+kill throughput at
	// ChurnInFlight.
	Churn map[string]Throughput `json:"churn,omitempty"`
	// ChurnByLevel holds, per target, the throughput at each of
	// ChurnLevels, in that order.
	ChurnByLevel map[string][]Throughput `json:"churn_by_level,omitempty"`
	// DensityRuns holds, per target, the outcome of the density group.
	DensityRuns map[string]DensityRun `json:"density_runs,omitempty"`
	// Limits is what the host's limits look like with agentenv's density
	// sandboxes up, and extrapolated to ten times as many.
	Limits *Limits `json:"limits,omitempty"`
	// Memory holds, per target and memory row, PSS per sandbox.
	Memory map[string]map[Operation]Memory `json:"memory,omitempty"`
	// BootSteps holds, per kind of agentenv boot (create, ready, restore),
	// the p50 of each step over the basic and restore groups' creates.
	BootSteps map[string][]BootStep `json:"boot_steps,omitempty"`
	// Bandwidth holds, per target and throughput row, MiB/s over a few
	// transfers.
	Bandwidth map[string]map[Operation]Bandwidth `json:"bandwidth,omitempty"`
	// Storage holds, per target and storage row, what a snapshot added to
	// disk.
	Storage map[string]map[Operation]Storage `json:"storage,omitempty"`
	// CPU holds, per target and CPU row, the CPU time of one operation;
	// CPUIdle each target's idle use in ms per second, subtracted from
	// every batch; CPURounds the batches per row.
	CPU       map[string]map[Operation]CPUCost `json:"cpu,omitempty"`
	CPUIdle   map[string]float64               `json:"cpu_idle_ms_per_s,omitempty"`
	CPURounds int                              `json:"cpu_rounds,omitempty"`
	// Rollout is the outcome of the rollout group.
	Rollout *RolloutReport `json:"rollout,omitempty"`
	// RL is the outcome of the rl group.
	RL *RLReport `json:"rl,omitempty"`
	// Notes explain targets that were skipped and how each was set up.
	Notes []string `json:"notes,omitempty"`
}

// target is one way of doing the measured work.
type target interface {
	name() string
	// create starts a container and returns once /bin/true has run in it.
	create(ctx context.Context) (string, error)
	// exec runs /bin/true in the container and waits for it.
	exec(ctx context.Context, id string) error
	// writeRead writes data to a file in the container, reads it back and
	// checks it.
	writeRead(ctx context.Context, id string, data []byte) error
	// kill destroys the container.
	kill(ctx context.Context, id string) error
}

// targets are the targets of one run; runsc and crun are nil when skipped.
type targets struct {
	all      []target
	agentenv *agentenvTarget
	runsc    *runscTarget
	crun     *crunTarget
}

// Run measures, writes the table to out and returns the report.
func Run(ctx context.Context, cfg Config, out io.Writer) (rep Report, err error) {
	if cfg.Client == nil && cfg.Serve.Binary == "" {
		return Report{}, errors.New("bench: no client and no server to start")
	}
	if cfg.Iterations < 1 || cfg.Warmup < 0 || cfg.HeavyIterations < 1 {
		return Report{}, fmt.Errorf("need at least 1 iteration, 1 heavy iteration and no negative warm-up, got -n %d --heavy-n %d --warmup %d", cfg.Iterations, cfg.HeavyIterations, cfg.Warmup)
	}
	if cfg.Template == "" {
		cfg.Template = "busybox"
	}
	if cfg.ChurnDuration <= 0 {
		cfg.ChurnDuration = 5 * time.Second
	}
	if len(cfg.ChurnLevels) == 0 {
		cfg.ChurnLevels = DefaultChurnLevels
	}
	for _, l := range cfg.ChurnLevels {
		if l < 1 {
			return Report{}, fmt.Errorf("churn level %d: give numbers of cycles in flight of at least 1", l)
		}
	}
	cfg.ChurnInFlight = mainChurnLevel(cfg.ChurnLevels, cfg.ChurnInFlight)
	if cfg.Density < 1 {
		cfg.Density = 10
	}
	if cfg.DensitySandboxes < 1 {
		cfg.DensitySandboxes = 1000
	}
	if cfg.DensityParallel < 1 {
		cfg.DensityParallel = 4
	}
	if cfg.HostPython == "" {
		cfg.HostPython = "/usr/bin/python3"
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.CPURounds < 1 {
		cfg.CPURounds = 3
	}
	if cfg.CPUOps < 1 {
		cfg.CPUOps = 8
	}
	if len(cfg.RolloutLevels) == 0 {
		cfg.RolloutLevels = DefaultRolloutLevels
	}
	if cfg.RolloutDuration <= 0 {
		cfg.RolloutDuration = 5 * time.Second
	}
	rep = Report{
		Template: cfg.Template, Iterations: cfg.Iterations, Warmup: cfg.Warmup, HeavyIterations: cfg.HeavyIterations,
		ChurnSeconds: cfg.ChurnDuration.Seconds(), ChurnInFlight: cfg.ChurnInFlight, Density: cfg.Density,
	}
	if cfg.runs(GroupChurn) {
		rep.ChurnLevels = cfg.ChurnLevels
	}

	// Everything set up pushes its teardown here; it runs even on error or
	// cancellation, under a context that is not cancelled but is bounded.
	var cl cleanupStack
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if cerr := cl.run(cctx); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	groups, notes := setUpCgroups(cfg, &cl)
	if cfg.Serve.Binary != "" {
		if cfg.runs(GroupRL) {
			// Before the user's flags, which win.
			cfg.Serve.Flags = append([]string{"--sandboxfusion-listen", "127.0.0.1:0"}, cfg.Serve.Flags...)
		}
		srv, err := startServer(ctx, cfg.Serve, cfg.Template, groups.get(TargetAgentenv), cfg.Progress)
		if err != nil {
			return rep, err
		}
		cl.push(srv.stop)
		cfg.Client = srv.client
		if cfg.runs(GroupRL) {
			if cfg.SandboxFusionURL, err = srv.sandboxFusionURL(ctx); err != nil {
				return rep, err
			}
		}
		notes = append(notes, strings.TrimSpace("agentenv: a server the bench started (--serve), with the serve defaults "+strings.Join(cfg.Serve.Flags, " ")))
	}
	if rep.ReadyTemplate, err = templateReady(ctx, cfg.Client, cfg.Template); err != nil {
		return rep, err
	}
	payload := make([]byte, PayloadSize)
	rand.Read(payload)
	ts, tnotes, err := setUp(ctx, cfg, payload, &cl)
	if err != nil {
		return rep, err
	}
	if ts.runsc != nil {
		ts.runsc.tool.cg = groups.get(TargetRunsc)
	}
	if ts.crun != nil {
		ts.crun.tool.cg = groups.get(TargetCrun)
	}
	rep.Notes = append(notes, tnotes...)
	for _, t := range ts.all {
		rep.Targets = append(rep.Targets, t.name())
	}

	r := &runner{cfg: cfg, ts: ts, groups: groups, rep: &rep, payload: payload, samples: map[string]map[Operation][]time.Duration{}}
	err = r.run(ctx)
	rep.Stats = r.stats()
	rep.BootSteps = ts.agentenv.bootSteps()
	if err != nil {
		return rep, err
	}
	return rep, WriteTable(out, rep)
}

// templateReady checks that the template exists and reports whether the
// server creates its sandboxes from a ready snapshot.
func templateReady(ctx context.Context, c *client.Client, name string) (bool, error) {
	tpls, err := c.ListTemplates(ctx)
	if err != nil {
		return false, fmt.Errorf("list templates: %w", err)
	}
	for _, t := range tpls {
		if t.TemplateID == name {
			return t.Ready, nil
		}
	}
	return false, fmt.Errorf("template %q does not exist on the server: pick one with --template (see `agentenv template list`)", name)
}

// runner runs the groups of rows one after the other and collects their
// samples.
type runner struct {
	cfg     Config
	ts      targets
	groups  *cpuGroups // nil: no CPU is counted
	rep     *Report
	payload []byte // what the raw targets' payload file holds
	samples map[string]map[Operation][]time.Duration
}

func (r *runner) run(ctx context.Context) error {
	phases := []struct {
		group string
		run   func(context.Context) error
	}{
		{GroupBasic, r.basic},
		{GroupPause, r.pauseResume},
		{GroupSnapshot, r.snapshotIdle},
		{GroupRestore, r.restore},
		{GroupFork, r.fork},
		{GroupDirty, r.dirtySnapshots},
		{GroupMemory, r.memory},
		{GroupChurn, r.churn},
		{GroupCPU, r.cpu},
		{GroupRollout, r.rollout},
		{GroupNetwork, r.network},
		{GroupDisk, r.diskWrite},
		{GroupLayers, r.layers},
		{GroupDensity, r.density},
		{GroupRL, r.rl},
	}
	for _, p := range phases {
		if !r.cfg.runs(p.group) {
			continue
		}
		if err := p.run(ctx); err != nil {
			if ctx.Err() != nil {
				// The step's own error ("signal: killed", "cannot reach
				// the server") would only confuse: say what happened.
				return fmt.Errorf("bench interrupted during %s: %w", p.group, context.Cause(ctx))
			}
			return fmt.Errorf("%s: %w", p.group, err)
		}
	}
	return nil
}

func (r *runner) progressf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
}

func (r *runner) add(target string, d map[Operation]time.Duration) {
	if r.samples[target] == nil {
		r.samples[target] = map[Operation][]time.Duration{}
	}
	for op, v := range d {
		r.samples[target][op] = append(r.samples[target][op], v)
	}
}

func (r *runner) stats() map[string]map[Operation]Stats {
	stats := map[string]map[Operation]Stats{}
	for name, byOp := range r.samples {
		stats[name] = map[Operation]Stats{}
		for op, s := range byOp {
			stats[name][op] = Summarize(s)
		}
	}
	return stats
}

// step is one sample of one target: it does the work and returns the time
// of each measured operation.
type step struct {
	target string
	run    func(ctx context.Context) (map[Operation]time.Duration, error)
}

// rounds runs warmup unmeasured and then iterations measured rounds of
// steps. Targets take turns step by step, so that a slow phase of the host
// (another job, page-cache pressure) hits every column alike.
func (r *runner) rounds(ctx context.Context, what string, iterations, warmup int, steps []step) error {
	var names []string
	for _, s := range steps {
		names = append(names, s.target)
	}
	if warmup > 0 {
		r.progressf("%s: warming up, %d round(s)", what, warmup)
	}
	for i := -warmup; i < iterations; i++ {
		if i == 0 {
			r.progressf("%s: measuring %d round(s) (%s)", what, iterations, strings.Join(names, ", "))
		}
		for _, s := range steps {
			d, err := s.run(ctx)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", s.target, i+warmup+1, err)
			}
			if i >= 0 {
				r.add(s.target, d)
			}
		}
	}
	return nil
}

// basic measures create/exec/file/kill cycles on every target.
func (r *runner) basic(ctx context.Context) error {
	r.ts.agentenv.recordBoots(true)
	defer r.ts.agentenv.recordBoots(false)
	var steps []step
	for _, t := range r.ts.all {
		steps = append(steps, step{t.name(), func(ctx context.Context) (map[Operation]time.Duration, error) {
			return cycle(ctx, t, r.payload)
		}})
	}
	return r.rounds(ctx, "create/exec/file/kill", r.cfg.Iterations, r.cfg.Warmup, steps)
}

// setUp builds the targets to measure and pushes their teardown onto cl.
// A raw target whose tool is missing is skipped with a note rather than
// failing the run, so agentenv can still be measured on a host without crun.
func setUp(ctx context.Context, cfg Config, payload []byte, cl *cleanupStack) (targets, []string, error) {
	at := newAgentenvTarget(cfg.Client, cfg.Template)
	cl.push(at.close)
	ts := targets{all: []target{at}, agentenv: at}
	if cfg.SkipRaw {
		return ts, nil, nil
	}
	if os.Geteuid() != 0 {
		return targets{}, nil, errors.New("the raw runsc and crun comparison needs root: run as root or pass --skip-raw")
	}
	fmt.Fprintln(cfg.Progress, "preparing a busybox rootfs and bundles for runsc and crun")
	dir, err := os.MkdirTemp("", "agentenv-bench-")
	if err != nil {
		return targets{}, nil, err
	}
	cl.push(func(context.Context) error { return os.RemoveAll(dir) })
	rootfs, err := makeRootfs(ctx, dir, cfg.Busybox)
	if err != nil {
		return targets{}, nil, err
	}
	// The raw runtimes read the write's input from a file (see tool).
	payloadFile := filepath.Join(dir, "payload")
	if err := os.WriteFile(payloadFile, payload, 0o600); err != nil {
		return targets{}, nil, err
	}

	var notes []string
	rt, err := newRunscTarget(ctx, cfg.Runsc, dir, rootfs, payloadFile)
	switch {
	case errors.Is(err, errToolMissing):
		notes = append(notes, fmt.Sprintf("runsc skipped: %v", err))
	case err != nil:
		return targets{}, nil, err
	default:
		cl.push(rt.close)
		ts.all = append(ts.all, rt)
		ts.runsc = rt
		notes = append(notes, "runsc: one runsc CLI call per step; busybox EROFS rootfs with memory overlay; --network=none --ignore-cgroups")
	}
	ct, err := newCrunTarget(ctx, cfg.Crun, dir, rootfs, payloadFile)
	switch {
	case errors.Is(err, errToolMissing):
		notes = append(notes, fmt.Sprintf("crun skipped: %v", err))
	case err != nil:
		return targets{}, nil, err
	default:
		cl.push(ct.close)
		ts.all = append(ts.all, ct)
		ts.crun = ct
		notes = append(notes, "crun: one crun CLI call per step; busybox directory rootfs (read-only, tmpfs /tmp); new netns; --cgroup-manager=disabled")
	}
	return ts, notes, nil
}

// cleanupStack runs teardowns in reverse order of setup, each once, and
// joins their errors.
type cleanupStack struct{ fns []func(context.Context) error }

func (c *cleanupStack) push(f func(context.Context) error) { c.fns = append(c.fns, f) }

func (c *cleanupStack) run(ctx context.Context) error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		errs = append(errs, c.fns[i](ctx))
	}
	c.fns = nil
	return errors.Join(errs...)
}

// cycle runs create, exec, write+read and kill once on t and returns the
// time of each step. If a step fails the container is killed before
// returning, so one failure does not leave a container running.
func cycle(ctx context.Context, t target, payload []byte) (map[Operation]time.Duration, error) {
	d := map[Operation]time.Duration{}
	start := time.Now()
	id, err := t.create(ctx)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	d[OpCreate] = time.Since(start)
	live := true
	defer func() {
		if live {
			t.kill(context.WithoutCancel(ctx), id)
		}
	}()

	start = time.Now()
	if err := t.exec(ctx, id); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	d[OpExec] = time.Since(start)

	start = time.Now()
	if err := t.writeRead(ctx, id, payload); err != nil {
		return nil, fmt.Errorf("write+read: %w", err)
	}
	d[OpFile] = time.Since(start)

	start = time.Now()
	live = false
	if err := t.kill(ctx, id); err != nil {
		return nil, fmt.Errorf("kill: %w", err)
	}
	d[OpKill] = time.Since(start)
	return d, nil
}

// checkPayload reports whether got is the payload that was written.
func checkPayload(got, want []byte) error {
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read back %d bytes that differ from the %d bytes written", len(got), len(want))
	}
	return nil
}
