package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	wire "github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/template"
)

// StepBuilder prepares a template's root filesystem from E2B's build steps
// (internal/imagebuild's Builder). Prepare runs spec's steps and returns
// the request that makes the template (its Tree, defaults and start
// commands) and a cleanup to run once the template store has taken the
// tree; a failed step is an *imagebuild.StepError. log gets every line of
// the build as it happens.
type StepBuilder interface {
	Prepare(ctx context.Context, spec imagebuild.Spec, log func(imagebuild.LogEntry)) (template.BuildRequest, func(), error)
}

// TemplateBuildsConfig configures E2B's template-in-code builds.
type TemplateBuildsConfig struct {
	// Steps runs the steps; nil: the build routes answer 503.
	Steps StepBuilder
	// FilesDir keeps the archives COPY steps upload, per template by hash,
	// and each template's tags.
	FilesDir string
	// MaxUploadBytes caps one uploaded archive (0: DefaultMaxUploadBytes).
	MaxUploadBytes int64
	// Meter, if set, admits uploaded archives against the host's disk
	// while they are written.
	Meter diskmeter.Open
	// MaxConcurrent is how many builds run at once; more wait (0: 2).
	MaxConcurrent int
	// MaxQueued caps builds started but waiting for a slot (0: 16); more
	// are refused with 429.
	MaxQueued int
	// MaxRecords bounds the builds remembered (0: 200): the oldest
	// finished (or never started) ones are forgotten first.
	MaxRecords int
	Log        *slog.Logger
}

// DefaultMaxUploadBytes caps one COPY archive unless the operator says
// otherwise (serve --max-copy-upload).
const DefaultMaxUploadBytes = 2 << 30

// maxLogEntries bounds one build's log; later lines are dropped (one line
// says so), the final status line is always kept.
const maxLogEntries = 20000

// Build statuses, as E2B's SDKs read them.
const (
	statusWaiting  = "waiting"
	statusBuilding = "building"
	statusReady    = "ready"
	statusError    = "error"
)

// TemplateBuilds runs E2B's template-in-code builds and remembers them
// in memory (a restarted server forgets them; the templates they made
// stay). One build runs per template at a time: starting a new one
// cancels the one running, as E2B does.
type TemplateBuilds struct {
	cfg     TemplateBuildsConfig
	files   *buildFiles
	slots   chan struct{}
	ctx     context.Context
	stop    context.CancelFunc
	running sync.WaitGroup

	mu      sync.Mutex
	builds  map[string]*stepBuild // by build ID
	order   []*stepBuild          // oldest first
	current map[string]*stepBuild // per template: the last build started
	queued  int
}

// NewTemplateBuilds returns the build service; Close stops its builds.
func NewTemplateBuilds(cfg TemplateBuildsConfig) (*TemplateBuilds, error) {
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 2
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 16
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = 200
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	files, err := openBuildFiles(cfg.FilesDir)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	return &TemplateBuilds{cfg: cfg, files: files, slots: make(chan struct{}, cfg.MaxConcurrent), ctx: ctx, stop: stop,
		builds: map[string]*stepBuild{}, current: map[string]*stepBuild{}}, nil
}

// Close cancels the running builds and waits for them to end.
func (tb *TemplateBuilds) Close() {
	tb.stop()
	tb.running.Wait()
}

// stepBuild is one build: its record and log.
type stepBuild struct {
	templateID, buildID string
	tags                []string
	cpus, memoryMB      int
	created             time.Time

	mu       sync.Mutex
	status   string
	started  bool
	finished bool
	log      []wire.BuildLogEntry
	dropped  bool
	lastStep string
	reason   *wire.BuildStatusReason
	cancel   context.CancelCauseFunc
	done     chan struct{}
}

func newBuildID() string {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	// A UUID's shape, as E2B's build IDs.
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// create records a new build of templateID in status waiting.
func (tb *TemplateBuilds) create(templateID string, tags []string, cpus, memoryMB int) *stepBuild {
	b := &stepBuild{templateID: templateID, buildID: newBuildID(), tags: tags, cpus: cpus, memoryMB: memoryMB,
		created: time.Now(), status: statusWaiting}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.builds[b.buildID] = b
	tb.order = append(tb.order, b)
	tb.trimLocked()
	return b
}

// trimLocked forgets the oldest builds that are not running beyond
// MaxRecords.
func (tb *TemplateBuilds) trimLocked() {
	for i := 0; len(tb.builds) > tb.cfg.MaxRecords && i < len(tb.order); {
		b := tb.order[i]
		b.mu.Lock()
		busy := b.started && !b.finished
		b.mu.Unlock()
		if busy {
			i++
			continue
		}
		delete(tb.builds, b.buildID)
		if tb.current[b.templateID] == b {
			delete(tb.current, b.templateID)
		}
		tb.order = append(tb.order[:i], tb.order[i+1:]...)
	}
}

// get returns the build buildID of templateID.
func (tb *TemplateBuilds) get(templateID, buildID string) (*stepBuild, error) {
	tb.mu.Lock()
	b := tb.builds[buildID]
	tb.mu.Unlock()
	if b == nil || b.templateID != templateID {
		return nil, errdefs.NotFound("build %q of template %q not found (builds are kept in memory: a restarted server forgets them; start a new build with POST /v3/templates)", buildID, templateID)
	}
	return b, nil
}

// start runs b with spec in the background through backend. It cancels
// the template's running build, if any, and waits for it before starting.
func (tb *TemplateBuilds) start(b *stepBuild, spec imagebuild.Spec, backend Backend) error {
	if tb.ctx.Err() != nil {
		return errdefs.Unavailable("the server is shutting down")
	}
	ctx, cancel := context.WithCancelCause(tb.ctx)
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		cancel(nil)
		return errdefs.Invalid("build %q was already started (status %s): request a new build with POST /v3/templates", b.buildID, b.status)
	}
	tb.mu.Lock()
	if tb.queued >= tb.cfg.MaxQueued {
		tb.mu.Unlock()
		b.mu.Unlock()
		cancel(nil)
		return fmt.Errorf("%d template builds are waiting for one of %d build slots: try again later: %w", tb.queued, tb.cfg.MaxConcurrent, errdefs.ErrResourceExhausted)
	}
	tb.queued++
	prev := tb.current[b.templateID]
	tb.current[b.templateID] = b
	tb.mu.Unlock()
	b.started, b.cancel, b.done = true, cancel, make(chan struct{})
	b.mu.Unlock()

	tb.running.Add(1)
	go tb.run(ctx, b, prev, spec, backend)
	return nil
}

func (tb *TemplateBuilds) run(ctx context.Context, b *stepBuild, prev *stepBuild, spec imagebuild.Spec, backend Backend) {
	defer tb.running.Done()
	defer close(b.done)
	queued := true
	unqueue := func() {
		if queued {
			tb.mu.Lock()
			tb.queued--
			tb.mu.Unlock()
			queued = false
		}
	}
	defer unqueue()
	if prev != nil {
		prev.cancelBy(b.buildID)
	}
	select {
	case tb.slots <- struct{}{}:
	case <-ctx.Done():
		b.fail(context.Cause(ctx), "")
		return
	}
	defer func() { <-tb.slots }()
	unqueue()
	// A step that never ends (a server, a prompt) must not hold a build
	// slot for ever.
	ctx, cancelT := context.WithTimeoutCause(ctx, buildTimeLimit,
		fmt.Errorf("the build ran longer than %s, this server's limit for one build: make the step that hangs end (no servers or prompts in RUN; start them with setStartCmd)", buildTimeLimit))
	defer cancelT()
	b.setStatus(statusBuilding)
	began := time.Now()
	from := spec.FromImage
	if from == "" {
		from = "template " + spec.FromTemplate
	}
	b.add(wire.BuildLogEntry{Level: "info", Message: fmt.Sprintf("Building template %s (build %s) from %s, %d step(s)", b.templateID, b.buildID, from, len(spec.Steps))})
	req, cleanup, err := tb.cfg.Steps.Prepare(ctx, spec, func(e imagebuild.LogEntry) {
		b.add(wire.BuildLogEntry{Timestamp: e.Time, Level: e.Level, Message: e.Message, Step: e.Step})
	})
	if err != nil {
		b.fail(causeOf(ctx, err), "")
		return
	}
	_, err = backend.BuildTemplate(ctx, req, func(p template.Progress) {
		msg := p.Phase
		if p.Message != "" {
			msg += ": " + p.Message
		}
		b.add(wire.BuildLogEntry{Level: "info", Message: msg, Step: "finalize"})
	})
	// Before the status says so: a finished build holds nothing.
	cleanup()
	if err != nil {
		b.fail(causeOf(ctx, err), "finalize")
		return
	}
	if err := tb.files.setTags(b.templateID, b.buildID, b.tags); err != nil {
		tb.cfg.Log.Warn("save template tags", "template", b.templateID, "err", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status, b.finished = statusReady, true
	b.appendLocked(wire.BuildLogEntry{Level: "info", Message: "Build finished, took " + time.Since(began).Round(10*time.Millisecond).String()}, true)
}

// buildTimeLimit bounds one build, from its slot to ready.
const buildTimeLimit = time.Hour

// causeOf prefers why ctx was cancelled (a newer build, shutdown) over
// the error that cancellation caused.
func causeOf(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	return err
}

// cancelBy cancels b in favour of build newer and waits for it to end.
func (b *stepBuild) cancelBy(newer string) {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel(fmt.Errorf("cancelled: build %s of the same template started", newer))
	<-done
}

func (b *stepBuild) setStatus(s string) {
	b.mu.Lock()
	b.status = s
	b.mu.Unlock()
}

// add appends one line to the log.
func (b *stepBuild) add(e wire.BuildLogEntry) {
	b.mu.Lock()
	b.appendLocked(e, false)
	b.mu.Unlock()
}

func (b *stepBuild) appendLocked(e wire.BuildLogEntry, final bool) {
	if e.Timestamp.IsZero() {
		e.Timestamp = time.Now()
	}
	e.Timestamp = e.Timestamp.UTC()
	switch e.Level {
	case "debug", "info", "warn", "error":
	default:
		e.Level = "info"
	}
	if e.Step != "" {
		b.lastStep = e.Step
	}
	if len(b.log) >= maxLogEntries && !final {
		if !b.dropped {
			b.dropped = true
			b.log = append(b.log, wire.BuildLogEntry{Timestamp: e.Timestamp, Level: "warn", Message: fmt.Sprintf("log truncated after %d lines", maxLogEntries)})
		}
		return
	}
	b.log = append(b.log, e)
}

// fail ends b with err. A failed step names its number; otherwise step
// (or the last step the log named) does.
func (b *stepBuild) fail(err error, step string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var se *imagebuild.StepError
	switch {
	case errors.As(err, &se):
		step = strconv.Itoa(se.Step)
	case step == "":
		step = b.lastStep
	}
	msg := err.Error()
	b.status, b.finished = statusError, true
	b.reason = &wire.BuildStatusReason{Message: msg, Step: step}
	for _, e := range b.log {
		if e.Step == step && step != "" && (e.Level == "warn" || e.Level == "error") {
			b.reason.LogEntries = append(b.reason.LogEntries, e)
		}
	}
	b.appendLocked(wire.BuildLogEntry{Level: "error", Message: "Build failed: " + msg, Step: step}, true)
}

// info is the build's status with its log from offset on: at most limit
// entries at or above level ("" for all).
func (b *stepBuild) info(offset, limit int, level string) wire.TemplateBuildInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := wire.TemplateBuildInfo{TemplateID: b.templateID, BuildID: b.buildID, Status: b.status,
		LogEntries: []wire.BuildLogEntry{}, Logs: []string{}, Reason: b.reason}
	min := levelRank(level)
	for i := offset; i < len(b.log) && len(out.LogEntries) < limit; i++ {
		if levelRank(b.log[i].Level) >= min {
			out.LogEntries = append(out.LogEntries, b.log[i])
		}
	}
	return out
}

func levelRank(l string) int {
	switch l {
	case "info":
		return 1
	case "warn":
		return 2
	case "error":
		return 3
	}
	return 0
}

// logsFrom returns at most limit entries at or above level from the time
// cursor (Unix ms; -1: the start, or now when backward) on, oldest first,
// or newest first when backward.
func (b *stepBuild) logsFrom(cursor int64, backward bool, limit int, level string) []wire.BuildLogEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := []wire.BuildLogEntry{}
	min := levelRank(level)
	for i := range b.log {
		if len(out) >= limit {
			break
		}
		e := b.log[i]
		if backward {
			e = b.log[len(b.log)-1-i]
		}
		ms := e.Timestamp.UnixMilli()
		if cursor >= 0 && (!backward && ms < cursor || backward && ms > cursor) {
			continue
		}
		if levelRank(e.Level) >= min {
			out = append(out, e)
		}
	}
	return out
}
