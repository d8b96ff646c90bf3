// Package gvisor implements runtime.Runtime on gVisor's runsc (platform
// systrap), with an EROFS root image and a memory write layer per sandbox.
//
// This first implementation drives the pinned runsc binary per operation;
// every use of runsc stays inside this package so that moving to gVisor's
// Go packages in-process is a change here only.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/cgroups"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
)

// Config configures the runtime.
type Config struct {
	// Runsc is the path of the pinned static runsc binary.
	Runsc string
	// Root is runsc's state directory (--root).
	Root string
	// Cgroups enables resource limits through cgroups under CgroupParent.
	// Without it, sandboxes run with --ignore-cgroups and no limits.
	Cgroups      bool
	CgroupParent string
}

// Gvisor is the gVisor runtime.
type Gvisor struct {
	runsc    string
	root     string
	cgroups  bool
	parent   string
	version  string
	features runscbin.Features
}

var (
	_ runtime.Runtime = (*Gvisor)(nil)
	_ runtime.Pauser  = (*Gvisor)(nil)
	_ runtime.Execer  = (*Gvisor)(nil)
)

// New checks that runsc is usable and returns the runtime.
func New(cfg Config) (*Gvisor, error) {
	if cfg.Runsc == "" {
		cfg.Runsc = "runsc"
	}
	path, err := exec.LookPath(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("runsc not found (%s): run `make setup` to install the pinned build: %w", cfg.Runsc, errdefs.ErrUnavailable)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "agentenv"
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, err
	}
	if err := runscbin.MkSharedRoot(); err != nil {
		return nil, err
	}
	g := &Gvisor{runsc: path, root: cfg.Root, cgroups: cfg.Cgroups, parent: cfg.CgroupParent}
	if g.version, g.features, err = runscbin.Version(path); err != nil {
		return nil, err
	}
	return g, nil
}

// Version implements runtime.Runtime.
func (g *Gvisor) Version() string { return g.version }

// Features are what the runsc build adds to upstream's.
func (g *Gvisor) Features() runscbin.Features { return g.features }

func (g *Gvisor) cgroupPath(id string) string { return "/" + g.parent + "/" + id }

// cgroupsPathFor is the spec's cgroups path: none when cgroups are off.
func (g *Gvisor) cgroupsPathFor(id string) string {
	if !g.cgroups {
		return ""
	}
	return g.cgroupPath(id)
}

func (g *Gvisor) globalArgs(network string) []string {
	// --allow-suid: setuid binaries work inside (E2B's templates give user
	// passwordless sudo); the sandbox's root is still gVisor's.
	args := []string{"--root", g.root, "--shared-root", runscbin.SharedRoot, "--platform", "systrap", "--network", network, "--allow-suid"}
	if !g.cgroups {
		args = append(args, "--ignore-cgroups")
	}
	return args
}

// Create implements runtime.Runtime.
func (g *Gvisor) Create(ctx context.Context, spec runtime.Spec) error {
	return g.start(ctx, spec, "run", "--detach")
}

// start runs `runsc <sub> <args> --bundle B ID` for a new sandbox (run or
// restore). On error nothing of the sandbox is left behind.
func (g *Gvisor) start(ctx context.Context, spec runtime.Spec, sub string, args ...string) (err error) {
	if spec.ID == "" || spec.Dir == "" || spec.Image == "" {
		return errdefs.Invalid("runtime spec needs an ID, a directory and an image")
	}
	defer func() {
		if err != nil {
			if derr := g.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				err = errors.Join(err, fmt.Errorf("clean up after failed %s: %w", sub, derr))
			}
		}
	}()
	bundle, err := ocispec.WriteBundle(spec, g.cgroupsPathFor(spec.ID), g.features)
	if err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	network := "sandbox"
	if spec.NetNS == "" {
		network = "none"
	}
	// The sandbox inherits runsc's stdio: give it a file, never a pipe, or
	// the caller would wait for the sandbox to exit.
	logPath := filepath.Join(spec.Dir, "console.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	full := append(append(g.globalArgs(network), sub), args...)
	cmd := exec.CommandContext(ctx, g.runsc, append(full, "--bundle", bundle, spec.ID)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s %s: %w: %s", sub, spec.ID, err, tail(logPath))
	}
	return nil
}

// State implements runtime.Runtime.
func (g *Gvisor) State(ctx context.Context, id string) (runtime.Status, error) {
	out, err := g.run(ctx, "state", id)
	if err != nil {
		if notExist(err) {
			return runtime.StatusUnknown, nil
		}
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("runsc state %s: %w", id, err)
	}
	switch st.Status {
	case "running":
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	default:
		return runtime.StatusStopped, nil
	}
}

// Destroy implements runtime.Runtime.
func (g *Gvisor) Destroy(ctx context.Context, id string) error {
	_, err := g.run(ctx, "delete", "--force", id)
	if err != nil && !notExist(err) {
		return err
	}
	if g.cgroups {
		// runsc removes them only for a sandbox whose process started.
		return cgroups.Remove(g.parent, id)
	}
	return nil
}

// List implements runtime.Runtime.
func (g *Gvisor) List(ctx context.Context) ([]string, error) {
	out, err := g.run(ctx, "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// Pause implements runtime.Pauser.
func (g *Gvisor) Pause(ctx context.Context, id string) error {
	_, err := g.run(ctx, "pause", id)
	return err
}

// Resume implements runtime.Pauser.
func (g *Gvisor) Resume(ctx context.Context, id string) error {
	_, err := g.run(ctx, "resume", id)
	return err
}

// Exec implements runtime.Execer.
func (g *Gvisor) Exec(ctx context.Context, id string, args []string) (int, []byte, error) {
	cmd := exec.CommandContext(ctx, g.runsc, append([]string{"--root", g.root, "exec", id}, args...)...)
	out := runtime.NewTail(runtime.ExecOutputMax)
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), out.Bytes(), nil
	}
	return 0, out.Bytes(), err
}

// run runs one runsc subcommand that does not start a sandbox.
func (g *Gvisor) run(ctx context.Context, sub string, args ...string) ([]byte, error) {
	full := append([]string{"--root", g.root, "--shared-root", runscbin.SharedRoot}, sub)
	if !g.cgroups {
		full = append([]string{"--ignore-cgroups"}, full...)
	}
	cmd := exec.CommandContext(ctx, g.runsc, append(full, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = nil
	if err := cmd.Run(); err != nil {
		return nil, &runscError{sub: sub, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return stdout.Bytes(), nil
}

type runscError struct {
	sub    string
	err    error
	stderr string
}

func (e *runscError) Error() string {
	return fmt.Sprintf("runsc %s: %v: %s", e.sub, e.err, e.stderr)
}

func (e *runscError) Unwrap() error { return e.err }

func notExist(err error) bool {
	var re *runscError
	return errors.As(err, &re) && (strings.Contains(re.stderr, "does not exist") || strings.Contains(re.stderr, "not found"))
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

var _ runtime.LayerStacker = (*Gvisor)(nil)

// StacksLayers says whether the runsc build stacks images (patch 0008).
func (g *Gvisor) StacksLayers() bool { return g.features.RootfsLowerImages }
