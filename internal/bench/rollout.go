package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/client"
)

// The rollout workload: what an RL trainer does with sandboxes. An agent
// creates a sandbox from the template, then takes rolloutSteps steps of
// (write a file, run a command that reads it, read the command's output);
// every rolloutForkEvery-th rollout forks rolloutChildren children after
// step rolloutForkAt, and each child finishes the episode (the parent is
// killed). A finished episode is one rollout: a forking one counts its
// children.
const (
	rolloutSteps     = 8
	rolloutForkEvery = 4
	rolloutForkAt    = 4
	rolloutChildren  = 4
	rolloutFileBytes = 256
)

// DefaultRolloutLevels are the numbers of agents the rollout group runs
// in parallel, one run per level and target.
var DefaultRolloutLevels = []int{1, 2, 4, 8, 16}

// rolloutHeadline is the level the headline figure shows (the highest
// level when it is not measured).
const rolloutHeadline = 8

// RolloutReport is the outcome of the rollout group.
type RolloutReport struct {
	Steps      int     `json:"steps"`
	ForkEvery  int     `json:"fork_every"`
	ForkAtStep int     `json:"fork_at_step"`
	Children   int     `json:"children"`
	FileBytes  int     `json:"file_bytes"`
	Seconds    float64 `json:"seconds_per_level"`
	Levels     []int   `json:"levels"`
	// Headline is the level of the headline figures.
	Headline int `json:"headline_agents"`
	// Targets are the measured targets in column order.
	Targets  []string                  `json:"targets"`
	ByTarget map[string][]RolloutLevel `json:"by_target"`
	// IdleMsPerS is each target's idle CPU use (ms per second), measured
	// before the first level and subtracted from every level's CPU.
	IdleMsPerS map[string]float64 `json:"idle_ms_per_s,omitempty"`
}

// RolloutLevel is one target's rollouts at one level of parallelism.
type RolloutLevel struct {
	Agents int `json:"agents"`
	// Rollouts are finished episodes; Started the rollouts begun (a
	// forking one once); Failed those with an error (a failed rollout
	// still kills what it created).
	Rollouts   int    `json:"rollouts"`
	Started    int    `json:"started"`
	Failed     int    `json:"failed"`
	FirstError string `json:"first_error,omitempty"`
	// Seconds from the start until the last rollout ended: rollouts
	// started before the deadline run to the end and count.
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	// CPUSeconds is the CPU of all the target's processes over the level,
	// idle use subtracted (0: not measured); PerCoreSecond is Rollouts
	// over it.
	CPUSeconds    float64 `json:"cpu_seconds"`
	PerCoreSecond float64 `json:"per_core_second"`
	// Step is one step's latency: write, command, output read.
	Step Stats `json:"step"`
	// HostCPUBusy is the host's busy share over the level (every process).
	HostCPUBusy float64 `json:"host_cpu_busy"`
}

// CPUMsPerRollout is the CPU one rollout cost, in ms (0: not measured).
func (l RolloutLevel) CPUMsPerRollout() float64 {
	if l.Rollouts == 0 || l.CPUSeconds == 0 {
		return 0
	}
	return 1000 * l.CPUSeconds / float64(l.Rollouts)
}

// rolloutTarget is what the rollout workload needs of a target.
type rolloutTarget interface {
	name() string
	// spawn creates a sandbox from the template and returns as soon as
	// the target says it runs (no command run in it yet).
	spawn(ctx context.Context) (string, error)
	// step writes content to path in the sandbox, runs `sh -c 'cat
	// path'` and returns the command's output.
	step(ctx context.Context, id, path string, content []byte) ([]byte, error)
	// fork makes n children of a running sandbox; the children it returns
	// must be killed, also when it fails.
	fork(ctx context.Context, id string, n int) ([]string, error)
	kill(ctx context.Context, id string) error
}

var (
	_ rolloutTarget = (*agentenvTarget)(nil)
	_ rolloutTarget = (*runscTarget)(nil)
)

// stepContent is what step s of rollout k writes: 256 bytes naming both,
// so that a step reading another's file would show.
func stepContent(k, s int) []byte {
	b := []byte(fmt.Sprintf("rollout %d step %d ", k, s))
	b = append(b, bytes.Repeat([]byte("x"), max(0, rolloutFileBytes-1-len(b)))...)
	return append(b, '\n')
}

// forks reports whether rollout k (counted from 0) forks.
func forks(k int) bool { return k%rolloutForkEvery == rolloutForkEvery-1 }

// rollout runs rollout k on t and returns the episodes it finished. Each
// step's latency goes to rec.
func rollout(ctx context.Context, t rolloutTarget, k int, rec func(time.Duration)) (episodes int, err error) {
	id, err := t.spawn(ctx)
	if err != nil {
		return 0, fmt.Errorf("create: %w", err)
	}
	last := rolloutSteps
	if forks(k) {
		last = rolloutForkAt
	}
	if err := steps(ctx, t, id, k, 1, last, rec); err != nil {
		return 0, errors.Join(err, t.kill(context.WithoutCancel(ctx), id))
	}
	if !forks(k) {
		if err := t.kill(ctx, id); err != nil {
			return 0, fmt.Errorf("kill: %w", err)
		}
		return 1, nil
	}
	kids, err := t.fork(ctx, id, rolloutChildren)
	if kerr := t.kill(ctx, id); kerr != nil {
		err = errors.Join(err, fmt.Errorf("kill the parent: %w", kerr))
	}
	if err != nil {
		return 0, errors.Join(fmt.Errorf("fork: %w", err), killAll(context.WithoutCancel(ctx), t, kids))
	}
	var (
		wg   sync.WaitGroup
		done atomic.Int32
		errs = make([]error, len(kids))
	)
	for i, kid := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := steps(ctx, t, kid, k, rolloutForkAt+1, rolloutSteps, rec); err != nil {
				errs[i] = errors.Join(fmt.Errorf("child %d: %w", i+1, err), t.kill(context.WithoutCancel(ctx), kid))
				return
			}
			if err := t.kill(ctx, kid); err != nil {
				errs[i] = fmt.Errorf("child %d: kill: %w", i+1, err)
				return
			}
			done.Add(1)
		}()
	}
	wg.Wait()
	return int(done.Load()), errors.Join(errs...)
}

// steps runs steps from..to of rollout k in sandbox id.
func steps(ctx context.Context, t rolloutTarget, id string, k, from, to int, rec func(time.Duration)) error {
	for s := from; s <= to; s++ {
		want := stepContent(k, s)
		start := time.Now()
		got, err := t.step(ctx, id, fmt.Sprintf("/tmp/step-%d", s), want)
		if err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("step %d: the command printed %q, want the %d bytes written", s, truncate(got, 64), len(want))
		}
		rec(time.Since(start))
	}
	return nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// runRollouts keeps agents rollouts going on t until d has passed, then
// waits for those in flight. A failed rollout is counted, not fatal; all
// failing is.
func runRollouts(ctx context.Context, t rolloutTarget, agents int, d time.Duration) (RolloutLevel, error) {
	var (
		mu    sync.Mutex
		out   = RolloutLevel{Agents: agents}
		times []time.Duration
		seq   atomic.Int64
		wg    sync.WaitGroup
	)
	rec := func(d time.Duration) {
		mu.Lock()
		times = append(times, d)
		mu.Unlock()
	}
	start := time.Now()
	deadline := start.Add(d)
	for range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				k := int(seq.Add(1) - 1)
				n, err := rollout(ctx, t, k, rec)
				mu.Lock()
				out.Started++
				out.Rollouts += n
				if err != nil && ctx.Err() == nil {
					out.Failed++
					if out.FirstError == "" {
						out.FirstError = err.Error()
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		return out, context.Cause(ctx)
	}
	out.Seconds = elapsed.Seconds()
	out.PerSecond = perSecond(out.Rollouts, elapsed)
	out.Step = Summarize(times)
	if out.Rollouts == 0 {
		return out, errors.New("every rollout failed: " + out.FirstError)
	}
	return out, nil
}

// rolloutTargets are agentenv and, unless skipped, raw runsc.
func (r *runner) rolloutTargets() []rolloutTarget {
	out := []rolloutTarget{r.ts.agentenv}
	if r.ts.runsc != nil {
		out = append(out, r.ts.runsc)
	}
	return out
}

// rollout runs the rollout workload at every level on every target: level
// by level, targets taking turns within a level.
func (r *runner) rollout(ctx context.Context) error {
	ts := r.rolloutTargets()
	rep := &RolloutReport{
		Steps: rolloutSteps, ForkEvery: rolloutForkEvery, ForkAtStep: rolloutForkAt, Children: rolloutChildren,
		FileBytes: rolloutFileBytes, Seconds: r.cfg.RolloutDuration.Seconds(), Levels: r.cfg.RolloutLevels,
		Headline: mainChurnLevel(r.cfg.RolloutLevels, rolloutHeadline),
		ByTarget: map[string][]RolloutLevel{}, IdleMsPerS: map[string]float64{},
	}
	r.rep.Rollout = rep
	meters := map[string]*cpuMeter{}
	for _, t := range ts {
		rep.Targets = append(rep.Targets, t.name())
		if g := r.groups.get(t.name()); g != nil {
			m := newCPUMeter(g)
			if err := m.calibrate(ctx); err != nil {
				return fmt.Errorf("%s: idle CPU: %w", t.name(), err)
			}
			meters[t.name()] = m
			rep.IdleMsPerS[t.name()] = 1000 * m.idle
		}
	}
	for _, level := range r.cfg.RolloutLevels {
		for _, t := range ts {
			r.progressf("rollout: %s, %d agents for %s", t.name(), level, r.cfg.RolloutDuration)
			var lvl RolloutLevel
			run := func(ctx context.Context) (err error) {
				lvl, err = runRollouts(ctx, t, level, r.cfg.RolloutDuration)
				return err
			}
			before, herr := readCPUTimes()
			var cpu time.Duration
			var err error
			if m := meters[t.name()]; m != nil {
				cpu, _, err = m.measure(ctx, run)
			} else {
				err = run(ctx)
			}
			if err != nil {
				return fmt.Errorf("%s with %d agents: %w", t.name(), level, err)
			}
			if after, err := readCPUTimes(); herr == nil && err == nil {
				lvl.HostCPUBusy = after.busySince(before)
			}
			if cpu > 0 {
				lvl.CPUSeconds = cpu.Seconds()
				lvl.PerCoreSecond = float64(lvl.Rollouts) / lvl.CPUSeconds
			}
			rep.ByTarget[t.name()] = append(rep.ByTarget[t.name()], lvl)
			if lvl.Failed > 0 {
				r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("rollout %s with %d agents: %d of %d rollouts failed; first: %s", t.name(), level, lvl.Failed, lvl.Started, lvl.FirstError))
			}
		}
	}
	return nil
}

// spawn creates a sandbox and returns once the server has it running.
func (t *agentenvTarget) spawn(ctx context.Context) (string, error) {
	sb, err := t.c.CreateSandbox(ctx, client.CreateRequest{TemplateID: t.template, Timeout: new(int64(300)), Metadata: map[string]string{benchLabel: t.run}})
	if err != nil {
		return "", err
	}
	t.remember(sb)
	return sb.SandboxID, nil
}

// step writes through envd's /files and runs the command through envd's
// process service.
func (t *agentenvTarget) step(ctx context.Context, id, path string, content []byte) ([]byte, error) {
	sb := t.sandbox(id)
	if err := t.c.WriteFile(ctx, sb, path, bytes.NewReader(content)); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	res, err := t.c.Exec(ctx, sb, "/bin/sh", []string{"-c", "cat " + path}, nil, nil)
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("cat %s exited with %d: %s", path, res.ExitCode, bytes.TrimSpace(res.Stderr))
	}
	return res.Stdout, nil
}

// spawn starts a container (`run --detach`) without running a command in
// it.
func (r *rawCommon) spawn(ctx context.Context) (string, error) {
	id := r.newID()
	if err := r.tool.run(ctx, nil, nil, "run", "--detach", "--bundle", r.bundle, id); err != nil {
		return "", errors.Join(err, r.kill(context.WithoutCancel(ctx), id))
	}
	return id, nil
}

// step is two CLI calls: `exec sh -c 'cat > path'` with the content as
// stdin, then `exec sh -c 'cat path'` with stdout to a file, read back.
func (r *rawCommon) step(ctx context.Context, id, path string, content []byte) ([]byte, error) {
	in, err := os.CreateTemp(r.dir, "in-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(in.Name())
	defer in.Close()
	if _, err := in.Write(content); err != nil {
		return nil, err
	}
	if _, err := in.Seek(0, 0); err != nil {
		return nil, err
	}
	if err := r.tool.run(ctx, in, nil, "exec", id, "/bin/sh", "-c", "cat > "+path); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	out, err := os.CreateTemp(r.dir, "out-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out.Name())
	out.Close()
	// O_APPEND: the sandbox writes at its own offset (see tool).
	outw, err := os.OpenFile(out.Name(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	defer outw.Close()
	if err := r.tool.run(ctx, nil, outw, "exec", id, "/bin/sh", "-c", "cat "+path); err != nil {
		return nil, err
	}
	return os.ReadFile(out.Name())
}

// rolloutDescription says what the rollout table measured.
func rolloutDescription(rep *RolloutReport) string {
	return strings.Join([]string{
		fmt.Sprintf("rollouts: N agents in parallel, %gs per level and target; a rollout: create from the template,", rep.Seconds),
		fmt.Sprintf("%d steps of (write a %d-byte file through envd, run `sh -c 'cat FILE'`, read its output), kill;", rep.Steps, rep.FileBytes),
		fmt.Sprintf("every %dth forks %d children after step %d that each finish the episode (the parent is killed);", rep.ForkEvery, rep.Children, rep.ForkAtStep),
		"rollouts/s counts finished episodes (a forking rollout counts its children); per core-second divides them",
		"by the CPU of every process of the target (idle subtracted); raw runsc: run --detach, exec with stdin/stdout files,",
		"checkpoint + restore for the fork, delete",
	}, "\n")
}
