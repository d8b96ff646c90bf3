package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"agentenv/internal/envd"
	"agentenv/internal/errdefs"
	"agentenv/internal/netns"
	"agentenv/internal/runtime"
)

// A pause without memory (E2B's pause with memory: false, or autoPause
// with autoPauseMemory: false) keeps only the sandbox's files, and a resume
// boots a fresh sandbox of its template with them.
//
// Today the write layer is gVisor's memory overlay, which only a
// checkpoint can save whole; so the pause asks the sandbox itself for its
// changes: the paths of its root filesystem, and an archive of the entries
// changed since it booted (ctime), both made in /dev/shm (outside the root
// filesystem) and downloaded through envd into the sandbox's directory.
// The container and its network slot are then released. The resume boots
// the template in a new slot, deletes the paths the sandbox no longer had,
// and unpacks the archive. When the write layer lives on disk, the pause
// will keep that layer's directory and the resume will boot on it.

const (
	filesArchive = "archive"
	filesPaths   = "paths"
	// shm is where the in-sandbox side of both steps keeps its files: a
	// tmpfs the walk of the root filesystem does not enter.
	shm = "/dev/shm/.agentenv-"
	// filesTimeout bounds one pause or resume of a sandbox's files.
	filesTimeout = 5 * time.Minute
)

// walk lists the files, directories and links of the root filesystem and
// of /tmp (gVisor mounts a tmpfs there; on E2B /tmp is on the disk; the
// first walk prunes it so that no path comes twice), without
// the kernel's filesystems (every other mount is skipped by -xdev). Names
// are NUL-terminated, relative ("./etc/hosts").
const walk = `find . ./tmp -xdev -mindepth 1 \( -path ./proc -o -path ./sys -o -path ./dev -o -path ./tmp \) -prune -o \( -type f -o -type d -o -type l \)`

// saveScript writes the path list and the archive of entries changed in
// the last %d minutes. Debian's GNU tar reads a NUL list; busybox's tar
// cannot, so its cpio writes the archive there.
const saveScript = `set -e; cd /; umask 077
` + walk + ` -print0 > ` + shm + `paths
` + walk + ` -cmin -%d -print0 > ` + shm + `changed
if tar --help 2>&1 | grep -q -- --null; then
	tar -c -f ` + shm + `archive --no-recursion --null -T ` + shm + `changed
else
	cpio -o -H newc -0 -F ` + shm + `archive < ` + shm + `changed 2>/dev/null
fi
rm -f ` + shm + `changed`

// restoreScript deletes the paths listed in gone (NUL-terminated) and
// unpacks the archive over the root filesystem (cpio or tar, by its magic).
const restoreScript = `set -e; cd /
if [ -s ` + shm + `gone ]; then xargs -0 rm -rf -- < ` + shm + `gone; fi
if [ "$(head -c 6 ` + shm + `archive)" = 070701 ]; then
	cpio -i -d -m -u -F ` + shm + `archive
else
	tar -x -p --numeric-owner -f ` + shm + `archive
fi
rm -f ` + shm + `*`

func (m *Manager) filesDir(id string) string { return filepath.Join(m.dir(id), "files") }

// pauseFilesLocked saves a running sandbox's files, then stops it and
// releases its network slot. On failure before the stop the sandbox keeps
// running as it was. Callers hold e.mu and have checked the state.
func (m *Manager) pauseFilesLocked(ctx context.Context, e *entry) error {
	ex, ok := m.d.Runtime.(runtime.Execer)
	if !ok {
		return fmt.Errorf("this runtime cannot pause a sandbox without its memory: %w", errdefs.ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), filesTimeout)
	defer cancel()
	sb, start := e.sb, time.Now()
	dir := m.filesDir(sb.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Every entry changed since the sandbox booted, with a margin: more
	// is harmless, less would lose files.
	since := e.bootAt
	if sb.StartedAt.Before(since) {
		since = sb.StartedAt
	}
	minutes := int(math.Ceil(time.Since(since).Minutes())) + 1
	if err := m.execScript(ctx, ex, sb.ID, fmt.Sprintf(saveScript, minutes)); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("save the files of sandbox %s: %w", sb.ID, err)
	}
	for _, f := range []string{filesPaths, filesArchive} {
		if err := m.envdDownload(ctx, sb, shm+f, filepath.Join(dir, f)); err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("save the files of sandbox %s: %w", sb.ID, err)
		}
	}
	// From here the sandbox stops: its requests end, its death is no
	// longer unexpected.
	e.sb.FilesOnly = true
	e.markGone()
	if err := m.d.Runtime.Destroy(ctx, sb.ID); err != nil {
		// Still running as far as we know: reachable and watched again.
		e.sb.FilesOnly = false
		e.gone, e.goneOnce = make(chan struct{}), sync.Once{}
		go m.watch(e)
		return fmt.Errorf("stop sandbox %s after saving its files: %w", sb.ID, err)
	}
	if err := m.d.Slots.Put(ctx, sb.Slot); err != nil {
		// Kept in the record: the resume or the teardown frees it.
		m.d.Log.Warn("pause without memory: network slot not released yet", "sandbox", sb.ID, "err", err)
	} else {
		e.sb.Slot = netns.Slot{}
	}
	m.stopClock(e)
	if err := m.move(e, StatePaused); err != nil {
		return err
	}
	m.d.Log.Info("sandbox paused without memory", "sandbox", sb.ID, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// rebootLocked boots a sandbox paused without memory again, from its
// template in a new network slot, and puts its files back. On failure
// nothing of the new boot is kept and the sandbox stays paused with its
// files. Callers hold e.mu.
func (m *Manager) rebootLocked(ctx context.Context, e *entry) (err error) {
	ex, ok := m.d.Runtime.(runtime.Execer)
	if !ok {
		return fmt.Errorf("this runtime cannot resume a sandbox paused without its memory: %w", errdefs.ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), filesTimeout)
	defer cancel()
	start := time.Now()
	next := e.sb
	if next.Slot.Namespace != "" {
		// The pause could not release it: do it now.
		if err := m.d.Slots.Put(ctx, next.Slot); err != nil {
			return busy("release the sandbox's previous network slot", err)
		}
		e.sb.Slot = netns.Slot{}
	}
	egress, err := next.Network.egress()
	if err != nil {
		return err
	}
	image, releaseTemplate, err := m.d.Templates.Acquire(next.Template)
	if err != nil {
		return err
	}
	defer releaseTemplate()
	var cl cleanup
	defer func() {
		if err != nil {
			// Not retried behind: a late destroy would hit the next boot
			// of this ID. The next resume destroys a leftover first.
			if cerr := cl.run(ctx); cerr != nil {
				m.d.Log.Error("cleanup after failed resume without memory", "sandbox", next.ID, "err", cerr)
			}
		}
	}()
	// A container left by a failed resume before this one (no-op if none).
	if err := m.d.Runtime.Destroy(ctx, next.ID); err != nil {
		return busy("remove what a failed resume left", err)
	}
	if next.Slot, err = m.d.Slots.Get(ctx); err != nil {
		return busy("set up the sandbox's network", err)
	}
	slot := next.Slot
	cl.add(func(ctx context.Context) error { return m.d.Slots.Put(ctx, slot) })
	cl.add(func(ctx context.Context) error { return m.d.Runtime.Destroy(ctx, next.ID) })
	if err := m.d.Net.SetEgress(ctx, slot, egress); err != nil {
		return busy("apply the egress policy", err)
	}
	if err := m.d.Runtime.Create(ctx, m.spec(next, image)); err != nil {
		return busy("boot the sandbox again", err)
	}
	if err := m.d.Net.Activate(ctx, slot); err != nil {
		return busy("activate the sandbox's network", err)
	}
	if err := m.waitEnvd(ctx, next); err != nil {
		return err
	}
	if err := m.restoreFiles(ctx, ex, next); err != nil {
		return busy("put the sandbox's files back", err)
	}
	// A boot runs the template's start command, here over the files the
	// sandbox had (as a boot from its disk would).
	if err := m.runStart(ctx, next); err != nil {
		return err
	}
	cl.keep()
	os.RemoveAll(m.filesDir(next.ID))
	next.FilesOnly = false
	e.sb = next
	e.gone, e.goneOnce = make(chan struct{}), sync.Once{}
	e.boot++
	e.bootAt = start
	// watch takes e.mu, which the caller holds.
	go m.watch(e)
	m.d.Log.Info("sandbox booted again with its files", "sandbox", next.ID, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// restoreFiles deletes from the fresh sandbox the paths the paused one no
// longer had, then unpacks the saved archive.
func (m *Manager) restoreFiles(ctx context.Context, ex runtime.Execer, sb Sandbox) error {
	dir := m.filesDir(sb.ID)
	kept, err := os.ReadFile(filepath.Join(dir, filesPaths))
	if err != nil {
		return err
	}
	if err := m.execScript(ctx, ex, sb.ID, "cd / && "+walk+" -print0 > "+shm+"now"); err != nil {
		return err
	}
	var now bytes.Buffer
	if err := m.envdGet(ctx, sb, shm+"now", &now); err != nil {
		return err
	}
	if err := m.envdPut(ctx, sb, shm+"gone", strings.NewReader(goneList(now.Bytes(), kept))); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(dir, filesArchive))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := m.envdPut(ctx, sb, shm+"archive", f); err != nil {
		return err
	}
	return m.execScript(ctx, ex, sb.ID, restoreScript)
}

// goneList returns the NUL-terminated paths of now that kept lacks.
func goneList(now, kept []byte) string {
	have := map[string]bool{}
	for _, p := range strings.Split(string(kept), "\x00") {
		have[p] = true
	}
	var b strings.Builder
	for _, p := range strings.Split(string(now), "\x00") {
		if p != "" && !have[p] {
			b.WriteString(p)
			b.WriteByte(0)
		}
	}
	return b.String()
}

// execScript runs a shell script as the sandbox's init user (root).
func (m *Manager) execScript(ctx context.Context, ex runtime.Execer, id, script string) error {
	code, out, err := ex.Exec(ctx, id, []string{"/bin/sh", "-c", script})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(string(out)))
	}
	return nil
}

// bulk is the HTTP client of file transfers with envd: no overall
// timeout (the context bounds them), the manager's marked dialer.
func (m *Manager) bulk() *http.Client {
	return &http.Client{Transport: m.client.Transport}
}

func (m *Manager) envdURL(sb Sandbox, path string) string {
	return "http://" + sb.Addr(envd.Port) + "/files?" + url.Values{"path": {path}, "username": {"root"}}.Encode()
}

func (m *Manager) envdDownload(ctx context.Context, sb Sandbox, path, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := m.envdGet(ctx, sb, path, f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (m *Manager) envdGet(ctx context.Context, sb Sandbox, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.envdURL(sb, path), nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Access-Token", sb.AccessToken)
	resp, err := m.bulk().Do(req)
	if err != nil {
		return fmt.Errorf("read %s from envd: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("read %s from envd: HTTP %d: %s", path, resp.StatusCode, msg)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

func (m *Manager) envdPut(ctx context.Context, sb Sandbox, path string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.envdURL(sb, path), body)
	if err != nil {
		return err
	}
	req.Header.Set("X-Access-Token", sb.AccessToken)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := m.bulk().Do(req)
	if err != nil {
		return fmt.Errorf("write %s through envd: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("write %s through envd: HTTP %d: %s", path, resp.StatusCode, msg)
	}
	return nil
}

// adoptFilesOnly takes back, after a restart, a sandbox paused without its
// memory: it has no container and no slot, only its files, which a resume
// boots again. It reports whether sb was one (and could be adopted).
func (m *Manager) adoptFilesOnly(sb Sandbox) bool {
	if sb.State != StatePaused || !sb.FilesOnly || sb.Slot.Namespace != "" {
		return false
	}
	for _, f := range []string{filesPaths, filesArchive} {
		if _, err := os.Stat(filepath.Join(m.filesDir(sb.ID), f)); err != nil {
			return false
		}
	}
	_, releaseTemplate, err := m.d.Templates.Acquire(sb.Template)
	if err != nil {
		return false
	}
	releaseSnap := func() {}
	if sb.Snapshot != "" && m.d.Snapshots != nil && m.d.Snapshots.Has(sb.Snapshot) {
		releaseSnap = m.d.Snapshots.Hold(sb.Snapshot)
	}
	e := newEntry(sb, func() { releaseTemplate(); releaseSnap() })
	m.mu.Lock()
	m.boxes[sb.ID] = e
	m.mu.Unlock()
	m.d.Log.Info("adopted sandbox paused without memory after restart", "sandbox", sb.ID)
	return true
}
