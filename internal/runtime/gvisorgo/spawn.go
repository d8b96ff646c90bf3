package gvisorgo

// This file runs in workers only (see worker.go): container.New borrows the
// calling process's stdio, cgroups and descriptor table.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gvisor.dev/gvisor/runsc/config"
	"gvisor.dev/gvisor/runsc/container"
	"gvisor.dev/gvisor/runsc/specutils"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
)

func consolePath(dir string) string { return filepath.Join(dir, "console.log") }

// runscLogPath is where the sandbox process writes its fatal errors and
// panics (runsc --log and --panic-log): without them, a sandbox that dies
// while booting says nothing but "cannot read client sync file: EOF".
func runscLogPath(dir string) string { return filepath.Join(dir, "runsc.log") }

// network is runsc's --network for spec: a sandbox without a network
// namespace gets no network at all.
func network(spec runtime.Spec) string {
	if spec.NetNS == "" {
		return "none"
	}
	return "sandbox"
}

// prepare writes the bundle for spec and creates its sandbox process (the
// container is in the Created state, as after `runsc create`). On error
// nothing of the sandbox is left behind.
func (w *worker) prepare(ctx context.Context, spec runtime.Spec) (*container.Container, *config.Config, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if _, err := w.loadContainer(spec.ID); err == nil {
		return nil, nil, errdefs.Conflict("sandbox %s already exists", spec.ID)
	}
	bundle, err := ocispec.WriteBundle(spec, w.cgroupPath(spec.ID), w.Features)
	if err != nil {
		return nil, nil, fmt.Errorf("write bundle: %w", err)
	}
	conf, err := w.startConf(spec)
	if err != nil {
		return nil, nil, err
	}
	// The sandbox writes the application's output at its own offsets:
	// O_APPEND keeps it from clobbering other writers of the log.
	console, err := os.OpenFile(consolePath(spec.Dir), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	defer console.Close()
	c, err := w.spawn(conf, spec.ID, bundle, console)
	if err != nil {
		err = fmt.Errorf("create sandbox %s: %w%s", spec.ID, err, logTails(spec.Dir))
		if _, lerr := w.loadContainer(spec.ID); lerr == nil || errors.Is(lerr, container.ErrStateFileLocked) {
			// Another create of the same ID won the race (gVisor says so
			// only in text; its state file says so for sure): its
			// cgroups are not ours to remove.
			return nil, nil, fmt.Errorf("%w: %w", err, errdefs.ErrConflict)
		}
		if cerr := w.removeCgroups(spec.ID); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, nil, err
	}
	return c, conf, nil
}

// startConf is the configuration for creating, starting or restoring
// spec's sandbox: the sandbox process logs its fatal errors and panics
// into the sandbox's directory.
func (w *worker) startConf(spec runtime.Spec) (*config.Config, error) {
	conf, err := w.conf(network(spec))
	if err != nil {
		return nil, err
	}
	conf.LogFilename = runscLogPath(spec.Dir)
	conf.PanicLog = runscLogPath(spec.Dir)
	return conf, nil
}

// spawn runs container.New like `runsc create` does: the spec read back
// from the bundle (validated and normalised by runsc's own code), the
// application's stdio on /dev/null and the console log.
func (w *worker) spawn(conf *config.Config, id, bundle string, console *os.File) (*container.Container, error) {
	null, err := devNull()
	if err != nil {
		return nil, err
	}
	// container.New gives the sandbox os.Stdin/os.Stdout/os.Stderr as the
	// application's stdio (sandbox.createSandboxProcess). This worker does
	// one thing at a time, so it can lend them for the call.
	stdin, stdout, stderr := os.Stdin, os.Stdout, os.Stderr
	os.Stdin, os.Stdout, os.Stderr = null, console, console
	defer func() { os.Stdin, os.Stdout, os.Stderr = stdin, stdout, stderr }()

	// container.New modifies the spec it gets: read it back from the bundle.
	spec, err := specutils.ReadSpec(bundle, conf)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if err := specutils.FixConfig(conf, spec); err != nil {
		return nil, fmt.Errorf("apply spec annotations: %w", err)
	}
	// No retry when the sandbox dies while booting ("cannot read client
	// sync file: EOF"): the one known cause cannot happen in a worker (see
	// worker.go), and the error quotes the sandbox's own log (logTails).
	return container.New(conf, container.Args{ID: id, Spec: spec, BundleDir: bundle})
}

// logTails returns the ends of the sandbox's own logs for an error
// message, or "".
func logTails(dir string) string {
	var out string
	for _, p := range []string{runscLogPath(dir), consolePath(dir)} {
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 2000 {
			b = b[len(b)-2000:]
		}
		out += fmt.Sprintf("; %s: %s", filepath.Base(p), strings.TrimSpace(string(b)))
	}
	return out
}
