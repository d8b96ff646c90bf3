package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/refcount"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
	"github.com/agentenv/agentenv/internal/template"
)

// Config configures a Builder.
type Config struct {
	// Dir is the build cache: pulled bases, layers, scratch (e.g.
	// <data-dir>/build). It must be on the template store's filesystem,
	// so that finished trees move into the store by rename.
	Dir string
	// Runsc is the runsc binary build sandboxes run on.
	Runsc string
	// Templates resolves fromTemplate and images already imported
	// (template build --oci).
	Templates *template.Store
	// Network gives a build sandbox a network namespace to run in; nil:
	// build sandboxes get no network.
	Network func(ctx context.Context) (netnsPath string, release func(), err error)
	// Registries are registry hosts (host[:port]) fromImage may reach
	// although they resolve to loopback, private or link-local addresses
	// (--registry-allow).
	Registries []string
	// Mirror is a registry host Docker Hub references are pulled through
	// (--registry-mirror).
	Mirror string
	// MaxCacheBytes bounds the bases and layers kept (0: 16 GiB); least
	// recently used ones no build holds go first.
	MaxCacheBytes int64
	// Limits bound every build sandbox (zero fields: DefaultLimits').
	Limits Limits
	// Meter, if set, admits what a build writes against the host's disk
	// while it writes it: unpacked images and COPY files, what RUN steps
	// write, the finished tree. A refusal fails the build, which leaves
	// nothing behind.
	Meter diskmeter.Open
	// ThinLayers makes a build on a template write only what its steps
	// changed, as a layer stacked on the template's (the runtime stacks
	// layers: runtime.LayerStacker); otherwise it writes a whole tree.
	ThinLayers bool
	Log        *slog.Logger
}

// DefaultMaxCacheBytes is the cache bound when Config sets none.
const DefaultMaxCacheBytes = 16 << 30

// Builder runs step builds. It is safe for concurrent use: builds share
// the cache, and a base or layer one build uses is never removed under it.
type Builder struct {
	cfg   Config
	log   *slog.Logger
	reach *reach

	mu    sync.Mutex
	inUse *refcount.Counts[string] // cache dirs held by running builds
}

// New returns a Builder over cfg.Dir, first removing what a crashed build
// left there: mounts, build sandboxes, scratch, half-written entries and
// trees no store took.
func New(cfg Config) (*Builder, error) {
	if cfg.Dir == "" || cfg.Templates == nil {
		return nil, errors.New("imagebuild: Config needs Dir and Templates")
	}
	if cfg.Runsc == "" {
		cfg.Runsc = "runsc"
	}
	p, err := exec.LookPath(cfg.Runsc)
	if err != nil {
		return nil, fmt.Errorf("runsc not found (%s): run `make setup` to install the pinned build: %w", cfg.Runsc, errdefs.ErrUnavailable)
	}
	cfg.Runsc = p
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.MaxCacheBytes <= 0 {
		cfg.MaxCacheBytes = DefaultMaxCacheBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	b := &Builder{cfg: cfg, log: cfg.Log, reach: newReach(cfg.Registries, cfg.Mirror)}
	b.inUse = refcount.New[string](&b.mu, nil)
	if err := b.recover(); err != nil {
		return nil, fmt.Errorf("build cache %s: %w", dir, err)
	}
	if err := makePrivate(dir); err != nil {
		return nil, err
	}
	if err := runscbin.MkSharedRoot(); err != nil {
		return nil, err
	}
	return b, nil
}

// recover undoes a crashed build: sandboxes first (their gofers hold the
// mounts), then mounts, then the directories.
func (b *Builder) recover() error {
	scratch := filepath.Join(b.cfg.Dir, "scratch")
	builds, _ := os.ReadDir(scratch)
	for _, bd := range builds {
		runRoot := filepath.Join(scratch, bd.Name(), "runsc")
		if _, err := os.Stat(runRoot); err != nil {
			continue
		}
		out, _ := exec.Command(b.cfg.Runsc, "--root", runRoot, "--shared-root", runscbin.SharedRoot, "list", "--quiet").Output()
		for _, id := range strings.Fields(string(out)) {
			destroySandbox(b.cfg.Runsc, runRoot, id)
		}
	}
	var errs []error
	for _, mp := range mountsUnder(b.cfg.Dir) {
		if err := template.Unmount(mp); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	for _, d := range []string{"scratch", "tmp", "trees"} {
		if err := os.RemoveAll(filepath.Join(b.cfg.Dir, d)); err != nil {
			return err
		}
	}
	return nil
}

// build is one Prepare: its spec, log, state and undo stack.
type build struct {
	b       *Builder
	spec    Spec
	log     func(LogEntry)
	scratch string
	// lowers are the base and the layers so far that hold files, top first.
	lowers  []string
	baseKey string
	st      state
	label   string
	limits  sandboxLimits
	undo    []func() error
	// meter charges what the build writes; created are the cache entries
	// it committed, removed if it fails.
	meter   diskmeter.Meter
	created []string
	// stack are the digests of the template layers the build runs on
	// (mounted at the bottom of lowers), if it started from a template;
	// releaseStack lets them go.
	stack        []string
	releaseStack func()
	// imageBase is the cache entry of the pulled image the build runs
	// on, if it did (made a layer when the template is thin).
	imageBase string
}

func (bd *build) push(f func() error) { bd.undo = append(bd.undo, f) }

// unwind runs the undo stack in reverse, once.
func (bd *build) unwind() error {
	var errs []error
	for i := len(bd.undo) - 1; i >= 0; i-- {
		if err := bd.undo[i](); err != nil {
			errs = append(errs, err)
		}
	}
	bd.undo = nil
	return errors.Join(errs...)
}

func (bd *build) logf(step, level, format string, args ...any) {
	bd.log(LogEntry{Time: time.Now(), Level: level, Step: step, Message: fmt.Sprintf(format, args...)})
}

// Prepare runs spec's steps and returns a template.BuildRequest whose Tree
// is the finished root filesystem, with the final env, workdir and user as
// its Defaults, the start and ready commands, and spec's CPUs and memory
// as its sandboxes' Size; the caller runs cleanup
// once the template store took the tree (or gave up). log gets every line.
// A failed step returns a *StepError; a failed Prepare leaves nothing
// behind but cache entries of the steps that succeeded.
func (b *Builder) Prepare(ctx context.Context, spec Spec, log func(LogEntry)) (req template.BuildRequest, cleanup func(), err error) {
	if log == nil {
		log = func(LogEntry) {}
	}
	if err := checkSpec(spec); err != nil {
		return template.BuildRequest{}, nil, err
	}
	limits, err := b.limitsFor(spec)
	if err != nil {
		return template.BuildRequest{}, nil, err
	}
	scratch, err := os.MkdirTemp(filepath.Join(b.cfg.Dir, "scratch"), "b-")
	if err != nil {
		return template.BuildRequest{}, nil, err
	}
	bd := &build{b: b, spec: spec, log: log, scratch: scratch, limits: limits,
		meter: b.cfg.Meter.Start(fmt.Sprintf("the build of template %q", spec.Name))}
	bd.push(func() error { return os.RemoveAll(scratch) })
	defer func() {
		// Held cache entries are released in any case; a failure also
		// removes the tree and the cache entries this build made (a
		// failed build leaves nothing behind), then gives back its
		// charge.
		if err != nil {
			err = errors.Join(err, bd.unwind())
			b.discard(bd.created)
			if bd.releaseStack != nil {
				bd.releaseStack()
			}
		}
		bd.meter.Close()
	}()
	start := time.Now()
	if err := bd.base(ctx); err != nil {
		return template.BuildRequest{}, nil, err
	}
	parent := bd.baseKey
	forced := spec.Force
	for i, st := range spec.Steps {
		forced = forced || st.Force
		if parent, err = bd.step(ctx, i+1, st, parent, forced); err != nil {
			return template.BuildRequest{}, nil, err
		}
	}
	tree, lowers, err := bd.finishTree(ctx)
	if err != nil {
		return template.BuildRequest{}, nil, err
	}
	if err := bd.unwind(); err != nil {
		os.RemoveAll(tree)
		return template.BuildRequest{}, nil, err
	}
	bd.logf("finalize", "info", "build steps done in %s", time.Since(start).Round(time.Millisecond))
	req = template.BuildRequest{
		Name:   spec.Name,
		Owner:  spec.Owner,
		Tree:   tree,
		Lowers: lowers,
		Image:  bd.label,
		Defaults: template.Defaults{
			Env:     bd.st.Env,
			Workdir: bd.st.Workdir,
			User:    bd.st.User,
		},
		Start: template.Start{StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd},
		// What the build asked for its sandbox is what the template's
		// sandboxes get, as on E2B.
		Size: template.Size{CPUs: spec.CPUs, MemoryMB: spec.MemoryMB},
	}
	var once sync.Once
	return req, func() {
		once.Do(func() {
			if err := os.RemoveAll(tree); err != nil {
				b.log.Warn("build: remove tree", "tree", tree, "err", err)
			}
			if bd.releaseStack != nil {
				bd.releaseStack()
			}
			b.trim()
		})
	}, nil
}

var stepTypes = map[string]bool{"RUN": true, "COPY": true, "ENV": true, "WORKDIR": true, "USER": true}

// checkSpec refuses what no step could run; the API layer checked shapes.
func checkSpec(spec Spec) error {
	if err := template.ValidName(spec.Name); err != nil {
		return err
	}
	if (spec.FromImage == "") == (spec.FromTemplate == "") {
		return errdefs.Invalid("give exactly one of fromImage and fromTemplate")
	}
	if spec.CPUs < 0 || spec.MemoryMB < 0 {
		return errdefs.Invalid("cpu and memory must not be negative")
	}
	for i, st := range spec.Steps {
		n := i + 1
		if !stepTypes[st.Type] {
			return errdefs.Invalid("step %d: type %q: use RUN, COPY, ENV, WORKDIR or USER", n, st.Type)
		}
		for _, a := range st.Args {
			if strings.IndexByte(a, 0) >= 0 {
				return errdefs.Invalid("step %d (%s): an argument contains NUL", n, st.Type)
			}
		}
		need := map[string]int{"RUN": 1, "COPY": 2, "ENV": 2, "WORKDIR": 1, "USER": 1}[st.Type]
		if len(st.Args) < need || st.Type == "ENV" && len(st.Args)%2 != 0 {
			return errdefs.Invalid("step %d (%s): %d arguments; see E2B's step encodings", n, st.Type, len(st.Args))
		}
		if st.Type == "COPY" && (st.FilesHash == "" || spec.Files == nil) {
			return errdefs.Invalid("step %d (COPY %s): no files (filesHash) for it", n, st.Args[0])
		}
	}
	return nil
}

// finishTree is finish, or for a build on a template's layers the tree of
// what its layers changed and the digests of the template's layers below
// it (a thin template), when the layers can say it (template.ThinBlocker).
func (bd *build) finishTree(ctx context.Context) (string, []string, error) {
	below := len(bd.stack)
	if bd.stack == nil {
		if bd.imageBase == "" || !bd.b.cfg.ThinLayers {
			tree, err := bd.finish(ctx)
			return tree, nil, err
		}
		below = 1 // the pulled image's tree, made a layer below
	}
	uppers := bd.lowers[:len(bd.lowers)-below]
	why := ""
	if !bd.b.cfg.ThinLayers {
		why = "this server's runtime stacks no layers"
	}
	for _, u := range uppers {
		if why != "" {
			break
		}
		why = template.ThinBlocker(u)
	}
	if why != "" {
		bd.logf("finalize", "info", "[finalize] writing the whole root filesystem (no thin layer: %s)", why)
		tree, err := bd.finish(ctx)
		return tree, nil, err
	}
	if bd.stack == nil {
		// The image's tree becomes a layer of the store, once per base:
		// every template from the image stacks on it.
		bd.logf("finalize", "info", "[finalize] the image as a shared layer")
		d, release, err := bd.b.cfg.Templates.LayerFromTree(ctx, bd.lowers[len(bd.lowers)-1], filepath.Join(bd.imageBase, "layer.digest"), bd.meter.Charge)
		if err != nil {
			return "", nil, err
		}
		bd.stack, bd.releaseStack = []string{d}, release
	}
	tree, err := os.MkdirTemp(filepath.Join(bd.b.cfg.Dir, "trees"), "t-")
	if err != nil {
		return "", nil, err
	}
	bd.logf("finalize", "info", "[finalize] writing the changed files as a layer on %d shared layer(s)", len(bd.stack))
	var size int64
	for _, u := range uppers {
		size += template.DiskUsage(u)
	}
	err = bd.meter.Charge(size)
	// The oldest layer first, each newer one over it; the overlay's own
	// xattrs stay behind (a thin layer carries none).
	for i := len(uppers) - 1; i >= 0 && err == nil; i-- {
		out, cerr := exec.CommandContext(ctx, "cp", "-a", "--no-preserve=xattr", "--", uppers[i]+"/.", tree+"/").CombinedOutput()
		if cerr != nil {
			err = fmt.Errorf("copy a built layer: %w: %s", cerr, strings.TrimSpace(string(out)))
		}
	}
	if err == nil {
		err = os.Chmod(tree, 0o755)
	}
	if err != nil {
		os.RemoveAll(tree)
		return "", nil, err
	}
	return tree, bd.stack, nil
}

// finish copies the merged view of the base and every layer into a fresh
// tree under trees/ (the template store's filesystem, so the store can
// rename it). Copying from the mounted view applies the layers' whiteouts
// instead of leaking them.
func (bd *build) finish(ctx context.Context) (string, error) {
	tree, err := os.MkdirTemp(filepath.Join(bd.b.cfg.Dir, "trees"), "t-")
	if err != nil {
		return "", err
	}
	bd.logf("finalize", "info", "[finalize] writing the root filesystem")
	var size int64
	for _, l := range bd.lowers {
		size += template.DiskUsage(l)
	}
	if err := bd.meter.Charge(size); err != nil {
		os.RemoveAll(tree)
		return "", err
	}
	_, err = bd.onOverlay(ctx, 0, filepath.Join(bd.scratch, "final-upper"), func(merged string) (state, error) {
		// The host's cp (never one from the tree): links stay links, owners,
		// modes, times and hard links are kept.
		out, err := exec.CommandContext(ctx, "cp", "-a", "--", merged+"/.", tree+"/").CombinedOutput()
		if err != nil {
			return state{}, fmt.Errorf("copy the built tree: %w: %s", err, strings.TrimSpace(string(out)))
		}
		return state{}, nil
	})
	if err != nil {
		os.RemoveAll(tree)
		return "", err
	}
	if err := os.Chmod(tree, 0o755); err != nil {
		os.RemoveAll(tree)
		return "", err
	}
	return tree, nil
}
