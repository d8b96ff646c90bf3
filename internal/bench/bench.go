// Package bench measures agentenv's sandbox operations against a running
// server and, in the same run, the same work done with the raw runsc CLI
// and with crun, and prints the result as a table.
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
	"strings"
	"time"

	"agentenv/internal/client"
)

// Config says what to measure.
type Config struct {
	// Client reaches the agentenv server under test.
	Client *client.Client
	// Template is the agentenv template sandboxes are created from.
	Template string
	// Iterations is the number of measured create/exec/file/kill cycles per
	// target.
	Iterations int
	// Warmup cycles run before the measured ones and are not counted: the
	// first cycle pays for cold page cache and connection setup.
	Warmup int
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

// Operation names one measured step (a stable key for JSON output).
type Operation string

// The measured steps.
const (
	OpCreate Operation = "create"
	OpExec   Operation = "exec"
	OpFile   Operation = "write_read_1mib"
	OpKill   Operation = "kill"
)

// Label is how the table names the step.
func (o Operation) Label() string {
	switch o {
	case OpCreate:
		return "create until a command runs"
	case OpExec:
		return "exec /bin/true"
	case OpFile:
		return "write + read 1 MiB"
	}
	return string(o)
}

// Operations lists the steps in table order.
var Operations = []Operation{OpCreate, OpExec, OpFile, OpKill}

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
	Template   string `json:"template"`
	Iterations int    `json:"iterations"`
	Warmup     int    `json:"warmup"`
	// Targets are the measured targets in column order.
	Targets []string `json:"targets"`
	// Stats holds, per target and operation, the summary of its samples.
	Stats map[string]map[Operation]Stats `json:"stats"`
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

// Run measures, writes the table to out and returns the report.
func Run(ctx context.Context, cfg Config, out io.Writer) (rep Report, err error) {
	if cfg.Client == nil {
		return Report{}, errors.New("bench: no client")
	}
	if cfg.Iterations < 1 || cfg.Warmup < 0 {
		return Report{}, fmt.Errorf("need at least 1 iteration and no negative warm-up, got -n %d --warmup %d", cfg.Iterations, cfg.Warmup)
	}
	if cfg.Template == "" {
		cfg.Template = "busybox"
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	rep = Report{Template: cfg.Template, Iterations: cfg.Iterations, Warmup: cfg.Warmup}

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
	payload := make([]byte, PayloadSize)
	rand.Read(payload)
	targets, notes, err := setUp(ctx, cfg, payload, progress, &cl)
	if err != nil {
		return rep, err
	}
	rep.Notes = notes
	for _, t := range targets {
		rep.Targets = append(rep.Targets, t.name())
	}

	if rep.Stats, err = measure(ctx, cfg, targets, payload, progress); err != nil {
		return rep, err
	}
	return rep, WriteTable(out, rep)
}

// measure runs the warm-up and measured cycles on every target and
// summarises the samples per target and operation.
func measure(ctx context.Context, cfg Config, targets []target, payload []byte, progress io.Writer) (map[string]map[Operation]Stats, error) {
	samples := map[string]map[Operation][]time.Duration{}
	var names []string
	for _, t := range targets {
		samples[t.name()] = map[Operation][]time.Duration{}
		names = append(names, t.name())
	}
	if cfg.Warmup > 0 {
		fmt.Fprintf(progress, "warming up: %d cycle(s) per target\n", cfg.Warmup)
	}
	// Targets take turns cycle by cycle, so that a slow phase of the host
	// (another job, page-cache pressure) hits every column alike.
	for i := -cfg.Warmup; i < cfg.Iterations; i++ {
		if i == 0 {
			fmt.Fprintf(progress, "measuring: %d cycles per target (%s)\n", cfg.Iterations, strings.Join(names, ", "))
		}
		for _, t := range targets {
			d, err := cycle(ctx, t, payload)
			if err != nil {
				if ctx.Err() != nil {
					// The step's own error ("signal: killed") would only
					// confuse: say what happened.
					return nil, fmt.Errorf("bench interrupted in %s, cycle %d: %w", t.name(), i+cfg.Warmup+1, context.Cause(ctx))
				}
				return nil, fmt.Errorf("%s, cycle %d: %w", t.name(), i+cfg.Warmup+1, err)
			}
			if i < 0 {
				continue
			}
			for op, v := range d {
				samples[t.name()][op] = append(samples[t.name()][op], v)
			}
		}
	}
	stats := map[string]map[Operation]Stats{}
	for name, byOp := range samples {
		stats[name] = map[Operation]Stats{}
		for op, s := range byOp {
			stats[name][op] = Summarize(s)
		}
	}
	return stats, nil
}

// setUp builds the targets to measure and pushes their teardown onto cl.
// A raw target whose tool is missing is skipped with a note rather than
// failing the run, so agentenv can still be measured on a host without crun.
func setUp(ctx context.Context, cfg Config, payload []byte, progress io.Writer, cl *cleanupStack) ([]target, []string, error) {
	at := newAgentenvTarget(cfg.Client, cfg.Template)
	cl.push(at.close)
	targets := []target{at}
	if cfg.SkipRaw {
		return targets, nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("the raw runsc and crun comparison needs root: run as root or pass --skip-raw")
	}
	fmt.Fprintln(progress, "preparing a busybox rootfs and bundles for runsc and crun")
	dir, err := os.MkdirTemp("", "agentenv-bench-")
	if err != nil {
		return nil, nil, err
	}
	cl.push(func(context.Context) error { return os.RemoveAll(dir) })
	rootfs, err := makeRootfs(ctx, dir, cfg.Busybox)
	if err != nil {
		return nil, nil, err
	}
	// The raw runtimes read the write's input from a file (see tool).
	payloadFile := filepath.Join(dir, "payload")
	if err := os.WriteFile(payloadFile, payload, 0o600); err != nil {
		return nil, nil, err
	}

	var notes []string
	rt, err := newRunscTarget(ctx, cfg.Runsc, dir, rootfs, payloadFile)
	switch {
	case errors.Is(err, errToolMissing):
		notes = append(notes, fmt.Sprintf("runsc skipped: %v", err))
	case err != nil:
		return nil, nil, err
	default:
		cl.push(rt.close)
		targets = append(targets, rt)
		notes = append(notes, "runsc: one runsc CLI call per step; busybox EROFS rootfs with memory overlay; --network=none --ignore-cgroups")
	}
	ct, err := newCrunTarget(ctx, cfg.Crun, dir, rootfs, payloadFile)
	switch {
	case errors.Is(err, errToolMissing):
		notes = append(notes, fmt.Sprintf("crun skipped: %v", err))
	case err != nil:
		return nil, nil, err
	default:
		cl.push(ct.close)
		targets = append(targets, ct)
		notes = append(notes, "crun: one crun CLI call per step; busybox directory rootfs (read-only, tmpfs /tmp); new netns; --cgroup-manager=disabled")
	}
	return targets, notes, nil
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
