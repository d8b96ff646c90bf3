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

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/service"
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
	// MaxPerKey is how many of those slots one named key's builds hold at
	// once, so that another key still gets one (0: MaxConcurrent-1, at
	// least 1). The operator and the single key have only MaxConcurrent.
	MaxPerKey int
	// MaxQueued caps builds started but waiting for a slot (0: 16); more
	// are refused with 429. One named key may have at most half of them
	// waiting (at least 1).
	MaxQueued int
	// MaxRecords bounds the builds remembered (0: 200): the oldest
	// finished (or never started) ones are forgotten first.
	MaxRecords int
	// MaxLogBytes bounds one build's log (0: DefaultMaxLogBytes): past
	// it, the middle of the log is dropped, and the log says so.
	MaxLogBytes int64
	// MaxLogBytesTotal bounds all builds' logs together (0:
	// DefaultMaxLogBytesTotal): the oldest finished builds' logs are
	// discarded first.
	MaxLogBytesTotal int64
	Log              *slog.Logger
}

// DefaultMaxUploadBytes caps one COPY archive unless the operator says
// otherwise (serve --max-copy-upload).
const DefaultMaxUploadBytes = 2 << 30

// Build statuses, as E2B's SDKs read them.
const (
	statusWaiting  = "waiting"
	statusBuilding = "building"
	statusReady    = "ready"
	statusError    = "error"
)

// TemplateBuilds runs E2B's template-in-code builds and remembers them
// in memory (a restarted server forgets them; the templates they made
// stay). One build runs per template at a time: a new one of the same
// owner cancels the one running, as E2B does; another key's is refused
// (the name is the running build's owner's). Builds are their owner's:
// another key finds none of them, and a named key holds at most its share
// of the slots and of the queue.
type TemplateBuilds struct {
	cfg     TemplateBuildsConfig
	files   *buildFiles
	slots   chan struct{}
	ctx     context.Context
	stop    context.CancelFunc
	running sync.WaitGroup
	logs    *logBudget

	mu       sync.Mutex
	builds   map[string]*stepBuild // by build ID
	order    []*stepBuild          // oldest first
	current  map[string]*stepBuild // per template: the last build started
	queued   int
	queuedBy map[string]int           // per named key
	keySlots map[string]chan struct{} // per named key, MaxPerKey each
}

// NewTemplateBuilds returns the build service; Close stops its builds.
func NewTemplateBuilds(cfg TemplateBuildsConfig) (*TemplateBuilds, error) {
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 2
	}
	if cfg.MaxPerKey <= 0 {
		cfg.MaxPerKey = max(cfg.MaxConcurrent-1, 1)
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 16
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = 200
	}
	if cfg.MaxLogBytes <= 0 {
		cfg.MaxLogBytes = DefaultMaxLogBytes
	}
	if cfg.MaxLogBytesTotal <= 0 {
		cfg.MaxLogBytesTotal = DefaultMaxLogBytesTotal
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
		logs:   &logBudget{max: cfg.MaxLogBytesTotal},
		builds: map[string]*stepBuild{}, current: map[string]*stepBuild{}, queuedBy: map[string]int{}, keySlots: map[string]chan struct{}{}}, nil
}

// Close cancels the running builds and waits for them to end.
func (tb *TemplateBuilds) Close() {
	tb.stop()
	tb.running.Wait()
}

// stepBuild is one build: its record and log.
type stepBuild struct {
	// owner is the key name the build is for ("": the operator).
	owner               string
	templateID, buildID string
	tags                []string
	cpus, memoryMB      int
	created             time.Time

	mu       sync.Mutex
	status   string
	started  bool
	finished bool
	log      *buildLog
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

// create records a new build of templateID for owner in status waiting.
func (tb *TemplateBuilds) create(owner, templateID string, tags []string, cpus, memoryMB int) *stepBuild {
	b := &stepBuild{owner: owner, templateID: templateID, buildID: newBuildID(), tags: tags, cpus: cpus, memoryMB: memoryMB,
		created: time.Now(), status: statusWaiting, log: newBuildLog(tb.cfg.MaxLogBytes, tb.logs)}
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
		b.mu.Lock()
		b.log.release()
		b.mu.Unlock()
		tb.logs.forget(b)
		if tb.current[b.templateID] == b {
			delete(tb.current, b.templateID)
		}
		tb.order = append(tb.order[:i], tb.order[i+1:]...)
	}
}

// get returns the build buildID of templateID if it is the caller's.
func (tb *TemplateBuilds) get(id identity, templateID, buildID string) (*stepBuild, error) {
	tb.mu.Lock()
	b := tb.builds[buildID]
	tb.mu.Unlock()
	if b == nil || b.templateID != templateID || !id.all() && b.owner != id.Name {
		return nil, errdefs.NotFound("build %q of template %q not found (builds are kept in memory: a restarted server forgets them; start a new build with POST /v3/templates)", buildID, templateID)
	}
	return b, nil
}

// hasTag reports whether tag names a build of template name.
func (tb *TemplateBuilds) hasTag(name, tag string) bool {
	_, ok := tb.files.tagged(name, tag)
	return ok
}

// unfinished reports whether b was started and has not ended.
func (b *stepBuild) unfinished() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started && !b.finished
}

// buildingLocked returns the owner of templateID's build that is started
// and not ended, if any.
func (tb *TemplateBuilds) buildingLocked(templateID string) (owner string, ok bool) {
	if b := tb.current[templateID]; b != nil && b.unfinished() {
		return b.owner, true
	}
	return "", false
}

// checkBuilder refuses owner's build of templateID while another key's
// build of it runs.
func (tb *TemplateBuilds) checkBuilder(owner, templateID string) error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.builderLocked(owner, templateID)
}

func (tb *TemplateBuilds) builderLocked(owner, templateID string) error {
	if by, ok := tb.buildingLocked(templateID); ok && by != owner {
		return fmt.Errorf("template %q is being built by another API key: a build of it can neither start beside nor cancel that one; build your own under another name: %w", templateID, errdefs.ErrPermissionDenied)
	}
	return nil
}

// perKeyQueue is how many builds one named key may have waiting.
func (tb *TemplateBuilds) perKeyQueue() int { return max(tb.cfg.MaxQueued/2, 1) }

// start runs b with spec in the background through backend; from says
// what the build starts from, for its log. It cancels the template's
// running build of the same owner, if any, and waits for it before
// starting; another owner's is not touched (refused).
func (tb *TemplateBuilds) start(b *stepBuild, spec imagebuild.Spec, from string, backend service.Backend) error {
	if tb.ctx.Err() != nil {
		return errdefs.Unavailable("the server is shutting down")
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if err := tb.builderLocked(b.owner, b.templateID); err != nil {
		return err
	}
	if tb.queued >= tb.cfg.MaxQueued {
		return fmt.Errorf("%d template builds are waiting for one of %d build slots: try again later: %w", tb.queued, tb.cfg.MaxConcurrent, errdefs.ErrResourceExhausted)
	}
	if b.owner != "" && tb.queuedBy[b.owner] >= tb.perKeyQueue() {
		return fmt.Errorf("%d builds of this API key are waiting for a build slot, its most at once: wait for one to start: %w", tb.queuedBy[b.owner], errdefs.ErrResourceExhausted)
	}
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		return errdefs.Invalid("build %q was already started (status %s): request a new build with POST /v3/templates", b.buildID, b.status)
	}
	ctx, cancel := context.WithCancelCause(tb.ctx)
	b.started, b.cancel, b.done = true, cancel, make(chan struct{})
	b.mu.Unlock()
	tb.queued++
	if b.owner != "" {
		tb.queuedBy[b.owner]++
	}
	prev := tb.current[b.templateID]
	tb.current[b.templateID] = b

	tb.running.Add(1)
	go tb.run(ctx, b, prev, spec, from, backend)
	return nil
}

// keySlot is owner's share of the build slots (nil for the operator).
func (tb *TemplateBuilds) keySlot(owner string) chan struct{} {
	if owner == "" {
		return nil
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	ks := tb.keySlots[owner]
	if ks == nil {
		ks = make(chan struct{}, tb.cfg.MaxPerKey)
		tb.keySlots[owner] = ks
	}
	return ks
}

func (tb *TemplateBuilds) run(ctx context.Context, b *stepBuild, prev *stepBuild, spec imagebuild.Spec, from string, backend service.Backend) {
	defer tb.running.Done()
	defer close(b.done)
	queued := true
	unqueue := func() {
		if queued {
			tb.mu.Lock()
			tb.queued--
			if b.owner != "" {
				if tb.queuedBy[b.owner]--; tb.queuedBy[b.owner] <= 0 {
					delete(tb.queuedBy, b.owner)
				}
			}
			tb.mu.Unlock()
			queued = false
		}
	}
	defer unqueue()
	if prev != nil {
		prev.cancelBy(b.buildID)
	}
	// The key's share first: waiting for it holds none of the slots
	// other keys' builds take.
	if ks := tb.keySlot(b.owner); ks != nil {
		select {
		case ks <- struct{}{}:
		case <-ctx.Done():
			b.fail(context.Cause(ctx), "")
			return
		}
		defer func() { <-ks }()
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
	b.add(wire.BuildLogEntry{Level: "info", Message: fmt.Sprintf("Building template %s (build %s) from %s, %d step(s)", b.templateID, b.buildID, from, len(spec.Steps))})
	// Each line may discard finished builds' logs, never this one's.
	defer tb.logs.reclaim()
	req, cleanup, err := tb.cfg.Steps.Prepare(ctx, spec, func(e imagebuild.LogEntry) {
		b.add(wire.BuildLogEntry{Timestamp: e.Time, Level: e.Level, Message: e.Message, Step: e.Step})
		tb.logs.reclaim()
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
	if !final {
		b.log.add(e)
		return
	}
	if b.log.end(e) {
		b.log.budget.finished(b)
	}
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
	b.log.each(func(e wire.BuildLogEntry) {
		if e.Step == step && step != "" && (e.Level == "warn" || e.Level == "error") {
			b.reason.LogEntries = append(b.reason.LogEntries, e)
		}
	})
	// Every status answer carries the reason: its last lines are enough
	// (and they stay when the log is discarded).
	n, size := len(b.reason.LogEntries), 0
	for n > 0 && len(b.reason.LogEntries)-n < maxReasonEntries && size+len(b.reason.LogEntries[n-1].Message) <= maxReasonBytes {
		size += len(b.reason.LogEntries[n-1].Message)
		n--
	}
	b.reason.LogEntries = b.reason.LogEntries[n:]
	b.appendLocked(wire.BuildLogEntry{Level: "error", Message: "Build failed: " + msg, Step: step}, true)
}

// maxReasonEntries and maxReasonBytes bound the log lines a failed
// build's reason repeats.
const (
	maxReasonEntries = 50
	maxReasonBytes   = 32 << 10
)

// info is the build's status with its log from offset on: at most limit
// entries at or above level ("" for all).
func (b *stepBuild) info(offset, limit int, level string) wire.TemplateBuildInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := wire.TemplateBuildInfo{TemplateID: b.templateID, BuildID: b.buildID, Status: b.status,
		LogEntries: []wire.BuildLogEntry{}, Logs: []string{}, Reason: b.reason}
	min := levelRank(level)
	shown := b.log.shown
	for i := offset; i < len(shown) && len(out.LogEntries) < limit; i++ {
		if levelRank(shown[i].Level) >= min {
			out.LogEntries = append(out.LogEntries, shown[i])
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
	n := b.log.count()
	for i := range n {
		if len(out) >= limit {
			break
		}
		e := b.log.at(i)
		if backward {
			e = b.log.at(n - 1 - i)
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
