package imagebuild

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/template"
)

// The build cache under Config.Dir:
//
//	bases/<key>/rootfs, state.json   a flattened image or a template's tree
//	layers/<key>/upper, state.json   one step's overlayfs upper dir
//	tmp/                             bases and layers being written
//	scratch/<build>/                 mounts, bundles, runsc state of a build
//	trees/<id>/                      finished trees, until the store took them
//
// A base or layer counts as cached once its directory is under bases/ or
// layers/: it is written in tmp/ and renamed there when complete, so a
// crash never leaves half of one that a later build would trust.

// state is what a build knows beside the files after a step: stored with
// every layer, so a cached prefix restores it.
type state struct {
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir"`
	User    string            `json:"user"`
	// Empty: the layer changed no file (ENV), so mounts skip it.
	Empty bool `json:"empty,omitempty"`
}

func (s state) clone() state {
	c := s
	c.Env = make(map[string]string, len(s.Env))
	for k, v := range s.Env {
		c.Env[k] = v
	}
	c.Empty = false
	return c
}

// layerKey is a step's cache key: its owner, its parent's key, type,
// arguments and files (named by the server's hash of their bytes), as
// E2B's orchestrator keys its layers. The owner keeps one key's layers
// from serving another: what a RUN step wrote depends on more than its
// command (the network it reached, the time it ran).
func layerKey(owner, parent string, st Step) string {
	return hashKey("owner", owner, parent, st.Type, strings.Join(st.Args, " "), st.FilesHash)
}

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (b *Builder) baseDir(key string) string  { return filepath.Join(b.cfg.Dir, "bases", key) }
func (b *Builder) layerDir(key string) string { return filepath.Join(b.cfg.Dir, "layers", key) }

// readState reads the state stored beside a base or layer; ok is false
// when the entry is not in the cache.
func readState(dir string) (state, bool, error) {
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return state{}, false, nil
	}
	if err != nil {
		return state{}, false, err
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return state{}, false, fmt.Errorf("%s: %w", dir, err)
	}
	now := time.Now()
	os.Chtimes(filepath.Join(dir, "state.json"), now, now) // for the cache's LRU trim
	return s, true, nil
}

// newTmp makes a directory under tmp/ for an entry being written.
func (b *Builder) newTmp(prefix string) (string, error) {
	return os.MkdirTemp(filepath.Join(b.cfg.Dir, "tmp"), prefix)
}

// commit writes s beside the entry written in tmp, renames it to final
// and holds it for the caller. If final exists (a concurrent build of the
// same key, or a forced rerun of a layer another build uses), the one in
// place stays when in use; the new one replaces it otherwise.
func (b *Builder) commit(tmp, final string, s state) (release func(), err error) {
	data, _ := json.Marshal(s)
	if err := os.WriteFile(filepath.Join(tmp, "state.json"), data, 0o600); err != nil {
		return nil, err
	}
	trash := ""
	defer func() {
		// Outside the lock (deferred before it is taken, so run after it
		// is released).
		if trash != "" {
			os.RemoveAll(trash)
		}
	}()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := os.Stat(final); err == nil {
		if b.inUse.N(final) > 0 {
			trash = tmp
			return b.holdLocked(final), nil
		}
		if trash, err = b.trashLocked(final); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	return b.holdLocked(final), nil
}

// discard removes the cache entries a failed build made that no other
// build holds (one that found an entry in the cache holds it).
func (b *Builder) discard(dirs []string) {
	var trash []string
	b.mu.Lock()
	for _, dir := range dirs {
		if b.inUse.N(dir) > 0 {
			continue
		}
		if t, err := b.trashLocked(dir); err == nil {
			trash = append(trash, t)
		}
	}
	b.mu.Unlock()
	for _, t := range trash {
		os.RemoveAll(t)
	}
}

// DiskBytes is what the build cache takes on the host: bases, layers,
// entries being written and finished trees, and the scratch of builds
// in progress (not the overlays mounted there, whose files are the
// layers').
func (b *Builder) DiskBytes() int64 {
	var n int64
	for _, d := range []string{"bases", "layers", "tmp", "trees", "scratch"} {
		n += usageOneFS(filepath.Join(b.cfg.Dir, d))
	}
	return n
}

// usageOneFS is template.DiskUsage of dir without descending into other
// file systems (the overlays a build mounts under scratch).
func usageOneFS(dir string) int64 {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		return 0
	}
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// lookup finds a cached base or layer and holds it, in one step under the
// lock, so neither a trim nor a forced rerun removes it in between.
func (b *Builder) lookup(dir string) (st state, release func(), ok bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, ok, err = readState(dir); err != nil || !ok {
		return state{}, nil, false, err
	}
	return st, b.holdLocked(dir), true, nil
}

// trashLocked moves a cache entry out of the cache at once (a rename, under
// the lock) and returns where it went, for the caller to remove after
// unlocking.
func (b *Builder) trashLocked(dir string) (string, error) {
	tmp, err := b.newTmp("trash-")
	if err != nil {
		return "", err
	}
	if err := os.Rename(dir, filepath.Join(tmp, "x")); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// holdLocked marks a cache entry as used by a build until the returned
// release: trimming and forced reruns leave it in place. Callers hold
// b.mu.
func (b *Builder) holdLocked(dir string) (release func()) { return b.inUse.Hold(dir) }

// trim removes the least recently used bases and layers no build holds
// until the cache takes at most MaxCacheBytes.
func (b *Builder) trim() {
	type entry struct {
		dir  string
		size int64
		used time.Time
	}
	var entries []entry
	var total int64
	for _, kind := range []string{"bases", "layers"} {
		des, _ := os.ReadDir(filepath.Join(b.cfg.Dir, kind))
		for _, de := range des {
			dir := filepath.Join(b.cfg.Dir, kind, de.Name())
			st, err := os.Stat(filepath.Join(dir, "state.json"))
			if err != nil {
				continue
			}
			e := entry{dir: dir, size: template.DiskUsage(dir), used: st.ModTime()}
			total += e.size
			entries = append(entries, e)
		}
	}
	if total <= b.cfg.MaxCacheBytes {
		return
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].used.Before(entries[j].used) })
	var trash []string
	b.mu.Lock()
	for _, e := range entries {
		if total <= b.cfg.MaxCacheBytes {
			break
		}
		if b.inUse.N(e.dir) > 0 {
			continue
		}
		t, err := b.trashLocked(e.dir)
		if err != nil {
			b.log.Warn("build cache: trim", "dir", e.dir, "err", err)
			continue
		}
		trash = append(trash, t)
		total -= e.size
	}
	b.mu.Unlock()
	for _, t := range trash {
		os.RemoveAll(t)
	}
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func randomID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
