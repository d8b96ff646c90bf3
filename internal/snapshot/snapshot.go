// Package snapshot stores sandbox snapshots: the files a runtime checkpoint
// writes, kept as content-addressed blobs (identical files are stored once),
// plus metadata (template, parent snapshot, runtime build, size, time). It
// counts who uses a snapshot and refuses to delete one that a sandbox or a
// child snapshot needs. It must not drive runtimes itself.
package snapshot

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"agentenv/internal/errdefs"
)

// Snapshot is one stored snapshot.
type Snapshot struct {
	ID        string            `json:"snapshotID"`
	Name      string            `json:"name,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Template  string            `json:"templateID"`
	Parent    string            `json:"parentSnapshotID,omitempty"`
	Sandbox   string            `json:"sandboxID"`
	Runtime   string            `json:"runtimeVersion"`
	Size      int64             `json:"sizeBytes"`
	CreatedAt time.Time         `json:"createdAt"`
	// Internal snapshots (made for a fork) are not listed.
	Internal bool `json:"internal,omitempty"`
	// What a restored sandbox inherits from the snapshotted one.
	CPUs     int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	// Nproc is the snapshotted sandbox's process cap (0: older snapshot).
	Nproc int64 `json:"nproc,omitempty"`
	// DiskMB is the snapshotted sandbox's write-layer size (0: an older
	// snapshot, whose layer was in memory). A restore must use the same.
	DiskMB      int               `json:"diskMB,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken string            `json:"envdAccessToken,omitempty"`
	// Files maps each checkpoint file name to its blob (sha256).
	Files map[string]string `json:"files"`
	// InUse counts sandboxes restored from it that still run (not persisted).
	InUse int `json:"inUse"`
}

// Store keeps snapshots under one directory: blobs/<sha256>, meta/<id>.json.
type Store struct {
	dir string

	mu    sync.Mutex
	snaps map[string]*Snapshot
	refs  map[string]int
}

// Open loads the snapshots under dir and removes half-written ones.
func Open(dir string) (*Store, error) {
	for _, d := range []string{"blobs", "meta", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	os.RemoveAll(filepath.Join(dir, "tmp"))
	os.MkdirAll(filepath.Join(dir, "tmp"), 0o700)
	s := &Store{dir: dir, snaps: map[string]*Snapshot{}, refs: map[string]int{}}
	entries, err := os.ReadDir(filepath.Join(dir, "meta"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "meta", e.Name()))
		if err != nil {
			return nil, err
		}
		var sn Snapshot
		if err := json.Unmarshal(b, &sn); err != nil {
			return nil, fmt.Errorf("snapshot metadata %s: %w", e.Name(), err)
		}
		if s.complete(&sn) {
			s.snaps[sn.ID] = &sn
		} else {
			os.Remove(filepath.Join(dir, "meta", e.Name()))
		}
	}
	s.removeUnusedBlobs()
	return s, nil
}

func (s *Store) complete(sn *Snapshot) bool {
	for _, h := range sn.Files {
		if _, err := os.Stat(s.blob(h)); err != nil {
			return false
		}
	}
	return len(sn.Files) > 0
}

func (s *Store) blob(hash string) string { return filepath.Join(s.dir, "blobs", hash) }

// TempDir returns a new directory for a runtime to checkpoint into, on the
// same filesystem as the blobs (so adding it is a rename, not a copy).
func (s *Store) TempDir() (string, error) {
	return os.MkdirTemp(filepath.Join(s.dir, "tmp"), "ckpt-")
}

// NewID returns a fresh snapshot ID.
func NewID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "snap-" + hex.EncodeToString(b)
}

// Add moves the files of checkpoint directory dir into the store as
// snapshot sn (its ID, if empty, is generated) and removes dir.
func (s *Store) Add(dir string, sn Snapshot) (Snapshot, error) {
	defer os.RemoveAll(dir)
	if sn.ID == "" {
		sn.ID = NewID()
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = time.Now().UTC()
	}
	sn.Files = map[string]string{}
	sn.Size = 0
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Snapshot{}, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		var h string
		var n int64
		if sn.Internal {
			// Internal snapshots (a fork's, a ready template's) are not
			// shared by content; hashing hundreds of MiB would only slow
			// the fork down.
			st, err := os.Stat(p)
			if err != nil {
				return Snapshot{}, err
			}
			h, n = "u-"+NewID()[len("snap-"):]+"-"+e.Name(), st.Size()
		} else if h, n, err = hashFile(p); err != nil {
			return Snapshot{}, err
		}
		if _, err := os.Stat(s.blob(h)); err == nil {
			os.Remove(p) // already stored: content-addressed dedup
		} else if err := os.Rename(p, s.blob(h)); err != nil {
			return Snapshot{}, err
		}
		sn.Files[e.Name()] = h
		sn.Size += n
	}
	if len(sn.Files) == 0 {
		return Snapshot{}, errors.New("checkpoint wrote no files")
	}
	if err := s.writeMeta(sn); err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	c := sn
	s.snaps[sn.ID] = &c
	s.mu.Unlock()
	return sn, nil
}

func (s *Store) writeMeta(sn Snapshot) error {
	sn.InUse = 0
	b, err := json.MarshalIndent(sn, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(s.dir, "meta", sn.ID+".json")
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// Get returns a snapshot.
func (s *Store) Get(id string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok {
		return Snapshot{}, errdefs.NotFound("snapshot %q does not exist", id)
	}
	c := *sn
	c.InUse = s.refs[id]
	return c, nil
}

// Has reports whether id names a stored snapshot.
func (s *Store) Has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.snaps[id]
	return ok
}

// List returns the snapshots (not internal ones), newest first, optionally
// only those of one sandbox.
func (s *Store) List(sandboxID string) []Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Snapshot{}
	for _, sn := range s.snaps {
		if sn.Internal || (sandboxID != "" && sn.Sandbox != sandboxID) {
			continue
		}
		c := *sn
		c.InUse = s.refs[sn.ID]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out
}

// ListAll returns every snapshot, internal ones included.
func (s *Store) ListAll() []Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Snapshot, 0, len(s.snaps))
	for _, sn := range s.snaps {
		c := *sn
		c.InUse = s.refs[sn.ID]
		out = append(out, c)
	}
	return out
}

// Acquire marks the snapshot as used by one more sandbox and returns a
// directory laid out as the runtime wrote it (hard links to the blobs),
// a function that removes that directory once the restore is done, and a
// function that releases the use (call it when the sandbox ends).
func (s *Store) Acquire(id string) (dir string, done func(), release func(), err error) {
	s.mu.Lock()
	sn, ok := s.snaps[id]
	if !ok {
		s.mu.Unlock()
		return "", nil, nil, errdefs.NotFound("snapshot %q does not exist (list them with GET /snapshots)", id)
	}
	files := sn.Files
	s.refs[id]++
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			s.refs[id]--
			s.mu.Unlock()
		})
	}
	dir, err = os.MkdirTemp(filepath.Join(s.dir, "tmp"), "restore-")
	if err != nil {
		release()
		return "", nil, nil, err
	}
	for name, h := range files {
		if err := os.Link(s.blob(h), filepath.Join(dir, name)); err != nil {
			os.RemoveAll(dir)
			release()
			return "", nil, nil, err
		}
	}
	return dir, func() { os.RemoveAll(dir) }, release, nil
}

// Hold marks a snapshot as used by a sandbox adopted after a restart.
func (s *Store) Hold(id string) func() {
	s.mu.Lock()
	s.refs[id]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.refs[id]--
			s.mu.Unlock()
		})
	}
}

// Delete removes a snapshot that no running sandbox and no child snapshot
// needs, and the blobs no other snapshot shares.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snaps[id]; !ok {
		return errdefs.NotFound("snapshot %q does not exist", id)
	}
	if n := s.refs[id]; n > 0 {
		return errdefs.Conflict("snapshot %q is used by %d running sandbox(es): kill them first", id, n)
	}
	for _, other := range s.snaps {
		if other.Parent == id {
			return errdefs.Conflict("snapshot %q is the parent of snapshot %q: delete that first", id, other.ID)
		}
	}
	return s.deleteLocked(id)
}

func (s *Store) deleteLocked(id string) error {
	sn := s.snaps[id]
	delete(s.snaps, id)
	if err := os.Remove(filepath.Join(s.dir, "meta", id+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	shared := map[string]bool{}
	for _, other := range s.snaps {
		for _, h := range other.Files {
			shared[h] = true
		}
	}
	for _, h := range sn.Files {
		if !shared[h] {
			os.Remove(s.blob(h))
		}
	}
	return nil
}

// removeUnusedBlobs deletes blobs no snapshot references (after a crash).
func (s *Store) removeUnusedBlobs() {
	used := map[string]bool{}
	for _, sn := range s.snaps {
		for _, h := range sn.Files {
			used[h] = true
		}
	}
	entries, _ := os.ReadDir(filepath.Join(s.dir, "blobs"))
	for _, e := range entries {
		if !used[e.Name()] {
			os.Remove(filepath.Join(s.dir, "blobs", e.Name()))
		}
	}
}

// Policy bounds the disk use of snapshots nothing needs.
type Policy struct {
	MaxAge   time.Duration // 0: no age limit
	MaxCount int           // 0: no count limit
	MaxBytes int64         // 0: no size limit
}

// GC deletes unreferenced snapshots (no running sandbox, no child) beyond
// the policy, oldest first, and returns the IDs it deleted. Internal
// snapshots left over from an interrupted fork always go.
func (s *Store) GC(p Policy) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var deleted []string
	for {
		var all []*Snapshot
		var total int64
		for _, sn := range s.snaps {
			all = append(all, sn)
			total += sn.Size
		}
		sort.Slice(all, func(i, j int) bool { return all[i].CreatedAt.Before(all[j].CreatedAt) })
		var victim *Snapshot
		for _, sn := range all {
			if s.refs[sn.ID] > 0 || s.hasChild(sn.ID) {
				continue
			}
			tooOld := p.MaxAge > 0 && time.Since(sn.CreatedAt) > p.MaxAge
			tooMany := p.MaxCount > 0 && len(all) > p.MaxCount
			tooBig := p.MaxBytes > 0 && total > p.MaxBytes
			// Only the server's own ready snapshots are kept regardless.
			ready := sn.Internal && strings.HasPrefix(sn.Name, "ready:")
			if (sn.Internal && !ready) || (!ready && (tooOld || tooMany || tooBig)) {
				victim = sn
				break
			}
		}
		if victim == nil {
			return deleted
		}
		s.deleteLocked(victim.ID)
		deleted = append(deleted, victim.ID)
	}
}

func (s *Store) hasChild(id string) bool {
	for _, other := range s.snaps {
		if other.Parent == id {
			return true
		}
	}
	return false
}

// FilePath returns the path of one checkpoint file of a snapshot (to copy
// it to another node). The file may go away once the snapshot is deleted.
func (s *Store) FilePath(id, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok {
		return "", errdefs.NotFound("snapshot %q does not exist on this node", id)
	}
	h, ok := sn.Files[name]
	if !ok {
		return "", errdefs.NotFound("snapshot %q has no file %q", id, name)
	}
	return s.blob(h), nil
}
