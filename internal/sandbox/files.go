package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
)

// A pause without memory (E2B's pause with memory: false, or autoPause
// with autoPauseMemory: false) keeps only the sandbox's files, and a resume
// boots a fresh sandbox of its template with them.
//
// Today the write layer's tree lives in the sentry's memory, which only a
// checkpoint saves whole; so the pause asks the sandbox's envd (ours, never
// a tool of the sandbox's filesystem) for the entries changed since it
// booted and the list of all its paths, one stream the host stores in the
// sandbox's directory, capped at what its write layer can hold. The
// container and its network slot are then released. The resume boots the
// template in a new slot and hands the stream to the new envd, which
// unpacks it and deletes the paths the sandbox no longer had. When the
// write layer's tree lives on disk, the pause will keep that layer and the
// resume will boot on it.

const (
	// filesArchive is the stream envd made (envdapi.ChangesPath).
	filesArchive = "changes"
	// filesTimeout bounds one pause or resume of a sandbox's files.
	filesTimeout = 5 * time.Minute
	// sinceMargin widens the window of changed files: more is harmless,
	// less would lose files.
	sinceMargin = time.Minute
)

// filesCap bounds the stream the host keeps of a sandbox: what its write
// layer can hold (its disk, or its memory when the layer is there), plus a
// margin for the archive's headers and path list. It returns both.
func filesCap(sb Sandbox) (layer, limit int64) {
	layer = int64(sb.DiskMB) << 20
	if layer <= 0 {
		layer = int64(sb.MemoryMB) << 20
	}
	return layer, layer + max(layer/8, 64<<20)
}

// pauseFilesLocked saves a running sandbox's files, then stops it and
// releases its network slot. On failure before the stop the sandbox keeps
// running as it was. Callers hold e.mu and have checked the state.
func (m *Manager) pauseFilesLocked(ctx context.Context, e *entry) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), filesTimeout)
	defer cancel()
	sb, start := e.sb, time.Now()
	dir := m.rec.filesDir(sb.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	since := e.bootAt
	if sb.StartedAt.Before(since) {
		since = sb.StartedAt
	}
	if err := m.saveFiles(ctx, sb, since.Add(-sinceMargin), filepath.Join(dir, filesArchive)); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("save the files of sandbox %s (it keeps running): %w", sb.ID, err)
	}
	saved := time.Since(start)
	// From here the sandbox stops: its requests end, its death is no
	// longer unexpected (the watch waits for e.mu, and then finds it
	// paused without memory).
	e.markGone()
	if err := m.reap.runUndo(ctx, &e.undo, 0, undoContainer); err != nil {
		// Still running as far as we know: reachable and watched again.
		e.gone, e.goneOnce = make(chan struct{}), sync.Once{}
		go m.watch(e)
		return fmt.Errorf("stop sandbox %s after saving its files: %w", sb.ID, err)
	}
	if err := m.reap.runUndo(ctx, &e.undo, 0, undoSlot); err != nil {
		// Kept in the record: the resume or the teardown frees it.
		m.d.Log.Warn("pause without memory: network slot not released yet", "sandbox", sb.ID, "err", err)
	} else {
		e.sb.Slot = netns.Slot{}
	}
	m.stopClock(e)
	if err := m.rec.move(e, StatePausedFiles); err != nil {
		return err
	}
	m.d.Log.Info("sandbox paused without memory", "sandbox", sb.ID, "took", time.Since(start).Round(time.Millisecond), "save", saved.Round(time.Millisecond))
	return nil
}

// rebootSteps boot a sandbox paused without memory again, from its
// template in a new network slot, and put its files back.
var rebootSteps = []step{{"leftovers", (*boot).clearLeftovers, false}, tmplStep, slotStep, egStep,
	{"boot", (*boot).bootRuntime, true}, netStep, envdStep, {"files", (*boot).restoreFiles, true}, startStep,
	{"rebooted", (*boot).rebooted, false}, {"watch", (*boot).watchLocked, false}}

// rebootLocked runs rebootSteps. On failure nothing of the new boot is
// kept and the sandbox stays paused with its files. Callers hold e.mu.
func (m *Manager) rebootLocked(ctx context.Context, e *entry) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), filesTimeout)
	defer cancel()
	b := m.newBoot(BootReboot, CreateRequest{}, nil)
	b.e, b.sb, b.u, b.floor = e, e.sb, &e.undo, len(e.undo.steps)
	eg, err := e.sb.Network.egress()
	if err != nil {
		return err
	}
	b.egress = eg
	return b.run(ctx, rebootSteps)
}

// clearLeftovers gives back the slot and container a pause could not
// release, or a failed reboot left (a late destroy behind the answer would
// hit this boot of the ID).
func (b *boot) clearLeftovers(ctx context.Context) error {
	if err := b.m.reap.runUndo(ctx, b.u, 0, undoContainer, undoSlot); err != nil {
		return busy("remove what the pause or a failed resume left", err)
	}
	b.sb.Slot, b.e.sb.Slot = netns.Slot{}, netns.Slot{}
	b.floor = len(b.u.steps)
	return nil
}

func (b *boot) restoreFiles(ctx context.Context) error {
	if err := b.m.restoreFiles(ctx, b.sb); err != nil {
		return fmt.Errorf("could not put the sandbox's files back (it stays paused with them; retry): %w: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// rebooted makes the new boot the sandbox's (its caller resumes it).
func (b *boot) rebooted(ctx context.Context) error {
	e := b.e
	os.RemoveAll(b.m.rec.filesDir(e.sb.ID))
	next := b.sb
	next.Boot = b.rec.clone()
	e.sb = next
	e.gone, e.goneOnce = make(chan struct{}), sync.Once{}
	e.boot++
	e.bootAt = b.start
	return nil
}

// watchLocked is watch for a caller that holds e.mu.
func (b *boot) watchLocked(ctx context.Context) error {
	b.m.watchBoot(b.e, b.e.sb.ID, b.e.gone, b.e.boot)
	return nil
}

// saveFiles stores in dst envd's stream of sb's files changed after since,
// refusing more than filesCap: the host writes at most that many bytes,
// whatever the sandbox streams (a sparse file reads as its whole size).
func (m *Manager) saveFiles(ctx context.Context, sb Sandbox, since time.Time, dst string) error {
	r, err := m.envd.Changes(ctx, envdOf(sb), since)
	if err != nil {
		return err
	}
	defer r.Close()
	return receiveFiles(dst, r, sb)
}

// receiveFiles writes r to the new file dst, at most filesCap(sb) bytes.
func receiveFiles(dst string, r io.Reader, sb Sandbox) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	layer, limit := filesCap(sb)
	n, err := io.Copy(f, io.LimitReader(r, limit+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return fmt.Errorf("receive the changed files from envd: %w", err)
	case n > limit:
		return fmt.Errorf("its changed files take more than %d MiB, the most kept for a sandbox whose write layer holds %d MiB (a sparse file counts whole): delete files, or pause with its memory: %w",
			limit>>20, layer>>20, errdefs.ErrTooLarge)
	}
	return nil
}

// restoreFiles hands the stored stream to the fresh sandbox's envd, which
// unpacks it and deletes what the paused sandbox no longer had.
func (m *Manager) restoreFiles(ctx context.Context, sb Sandbox) error {
	f, err := os.Open(filepath.Join(m.rec.filesDir(sb.ID), filesArchive))
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	return m.envd.PutChanges(ctx, envdOf(sb), f, st.Size())
}

// adoptFilesOnly takes back, after a restart, a sandbox paused without its
// memory: it has no container and no slot, only its files, which a resume
// boots again. It reports whether sb was one (and could be adopted).
func (m *Manager) adoptFilesOnly(sb Sandbox) bool {
	if sb.State != StatePausedFiles || sb.Slot.Namespace != "" {
		return false
	}
	if _, err := os.Stat(filepath.Join(m.rec.filesDir(sb.ID), filesArchive)); err != nil {
		return false
	}
	_, releaseTemplate, err := m.d.Templates.Acquire(sb.Template)
	if err != nil {
		return false
	}
	m.adopt(sb, releaseTemplate)
	m.d.Log.Info("adopted sandbox paused without memory after restart", "sandbox", sb.ID)
	return true
}
