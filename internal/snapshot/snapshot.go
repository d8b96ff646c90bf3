// Package snapshot stores sandbox snapshots: the files a runtime checkpoint
// writes, kept as content-addressed chunks of pages shared by every snapshot
// on the node (a snapshot of a sandbox stores only the pages that changed
// since its previous snapshot), plus metadata (template, parent snapshot,
// runtime build, size, time). It counts who uses a snapshot and refuses to
// delete one that a sandbox or a child snapshot needs; a chunk goes when no
// snapshot references it. It must not drive runtimes itself.
package snapshot

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/volume"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/refcount"
)

// Snapshot is one stored snapshot.
type Snapshot struct {
	ID       string            `json:"snapshotID"`
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Template string            `json:"templateID"`
	// ImageID is the template image the sandbox ran on; a restore needs
	// that image (template.Store.AcquireImage). Empty: an older snapshot,
	// restored on the template's current image.
	ImageID string `json:"imageID,omitempty"`
	// Lowers are the template layers below that image (SHA-256 digests,
	// top first): a restore stacks the same ones in the same order.
	Lowers    []string  `json:"lowers,omitempty"`
	Parent    string    `json:"parentSnapshotID,omitempty"`
	Sandbox   string    `json:"sandboxID"`
	Runtime   string    `json:"runtimeVersion"`
	Size      int64     `json:"sizeBytes"`
	CreatedAt time.Time `json:"createdAt"`
	// Internal snapshots (made for a fork) are not listed.
	Internal bool `json:"internal,omitempty"`
	// Kind says who made it: KindUser (kept until deleted) or KindAuto
	// (agentenv's own, collected by the retention policy). Empty on disk:
	// made before the mark, read as kindOf says.
	Kind string `json:"kind,omitempty"`
	// Owner is the name of the API key whose sandbox it was taken of
	// (named keys); only that key (and the operator) sees it.
	Owner string `json:"owner,omitempty"`
	// What a restored sandbox inherits from the snapshotted one.
	CPUs     int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	// Nproc is the snapshotted sandbox's process cap (0: older snapshot).
	Nproc int64 `json:"nproc,omitempty"`
	// Volumes are the volumes the snapshotted sandbox mounted: a restore
	// mounts the same (a snapshot does not contain their contents).
	Volumes []volume.Mount `json:"volumes,omitempty"`
	// DiskMB is the snapshotted sandbox's write-layer size (0: an older
	// snapshot, whose layer was in memory). A restore must use the same.
	DiskMB int `json:"diskMB,omitempty"`
	// LayerBytes is what the snapshotted sandbox's write layer held on
	// disk (allocated blocks): what a restore writes back into its new
	// layer, reserved on the host's disk while it does.
	LayerBytes  int64             `json:"layerBytes,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken string            `json:"envdAccessToken,omitempty"`
	// Files maps each checkpoint file name to where its bytes are.
	Files map[string]File `json:"files"`
	// Chunks gives the size in bytes of every chunk the files reference,
	// in the description a node sends another (Manifest): the receiver
	// bounds each download by it. Not persisted.
	Chunks map[string]int64 `json:"chunks,omitempty"`
	// Stored is the bytes of the chunks this snapshot added to the store
	// when it was taken (what it cost beyond the snapshots before it).
	Stored int64 `json:"storedBytes"`
	// InUse counts sandboxes restored from it that still run (not persisted).
	InUse int `json:"inUse"`
	// Timing says where Add spent its time (not persisted).
	Timing Timing `json:"-"`
}

// The kinds of snapshot.
const (
	// KindUser: a user asked for it (the snapshot API, E2B's
	// createSnapshot, `agentenv sandbox snapshot`). It lives until the
	// user deletes it; a full store refuses new ones instead.
	KindUser = "user"
	// KindAuto: agentenv made it for its own use (a fork's checkpoint, a
	// ready template, a fork spilling to another node); the retention
	// policy collects it.
	KindAuto = "auto"
)

// forkOfKey is the metadata a fleet fork spilling over its parent's node
// put on the snapshot it made, before snapshots carried their kind.
const forkOfKey = "agentenv.fork-of"

// kindOf is a snapshot's kind, for one stored before snapshots were marked
// too. Internal ones were agentenv's (fork checkpoints, ready templates),
// as were those a fleet fork made (they carry forkOfKey); every other one
// was made by the snapshot API at a user's request. Reading an unmarked
// one as the user's is the safe mistake: a kept snapshot costs disk the
// user can free, a deleted one is lost.
func kindOf(sn *Snapshot) string {
	switch {
	case sn.Kind == KindUser || sn.Kind == KindAuto:
		return sn.Kind
	case sn.Internal, sn.Metadata[forkOfKey] != "":
		return KindAuto
	default:
		return KindUser
	}
}

// File is one checkpoint file: its size and its bytes, in order, as slices
// of chunks.
type File struct {
	Size    int64    `json:"size"`
	Extents []Extent `json:"extents"`
}

// Extent is Len bytes of a chunk from offset Off.
type Extent struct {
	Chunk string `json:"chunk"`
	Off   int64  `json:"off"`
	Len   int64  `json:"len"`
}

// Timing is where Add spent its time.
type Timing struct {
	Hash  time.Duration // reading and hashing pages, finding shared ones, deflating small files
	Write time.Duration // writing new chunks, the page index and metadata
}

// chunks returns the distinct chunks a snapshot references.
func (sn *Snapshot) chunks() map[string]bool {
	out := map[string]bool{}
	for _, f := range sn.Files {
		for _, e := range f.Extents {
			out[e.Chunk] = true
		}
	}
	return out
}

// Store keeps snapshots under one directory: chunks/<name>, meta/<id>.json
// and index/<id>/<file> (the page hashes of a file, so that the next
// snapshot of the same sandbox can find the pages it shares).
type Store struct {
	dir string

	mu    sync.Mutex
	snaps map[string]*Snapshot
	refs  *refcount.Counts[string] // sandboxes using a snapshot
	asm   map[string]*assembly     // files put together for the sandboxes using a snapshot
	// chunkRefs counts the snapshots referencing a chunk; pins count the
	// snapshots being added that will reference it. A chunk file goes
	// when both are zero.
	chunkRefs map[string]int
	pins      map[string]int
	chunkSize map[string]int64
	// policy bounds the store (SetPolicy); admitted counts the user
	// snapshots admitted (Admit) and not yet stored or given up.
	policy   Policy
	admitted int
}

// Open loads the snapshots under dir, drops those whose chunks are missing
// (a crash mid-snapshot) and removes chunks no snapshot references.
func Open(dir string) (*Store, error) {
	for _, d := range []string{"chunks", "meta", "index", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	os.RemoveAll(filepath.Join(dir, "tmp"))
	os.MkdirAll(filepath.Join(dir, "tmp"), 0o700)
	s := &Store{dir: dir, snaps: map[string]*Snapshot{}, asm: map[string]*assembly{},
		chunkRefs: map[string]int{}, pins: map[string]int{}, chunkSize: map[string]int64{}}
	s.refs = refcount.New(&s.mu, s.lastReleasedLocked)
	entries, err := os.ReadDir(filepath.Join(dir, "meta"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		sn, err := s.load(filepath.Join(dir, "meta", e.Name()))
		if err != nil {
			return nil, err
		}
		if sn != nil && s.complete(sn) {
			sn.Kind = kindOf(sn)
			s.snaps[sn.ID] = sn
			for c := range sn.chunks() {
				s.chunkRefs[c]++
			}
		} else {
			os.Remove(filepath.Join(dir, "meta", e.Name()))
		}
	}
	s.removeUnused()
	return s, nil
}

// load reads one metadata file, converting the format before chunks (one
// blob per file under blobs/, named by its SHA-256). Metadata whose ID is
// not its file's name is not this store's: it is dropped (nil).
func (s *Store) load(p string) (*Snapshot, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var id struct {
		ID string `json:"snapshotID"`
	}
	if json.Unmarshal(b, &id) == nil && id.ID+".json" != filepath.Base(p) {
		return nil, nil
	}
	var sn Snapshot
	if err := json.Unmarshal(b, &sn); err == nil {
		return &sn, nil
	}
	var legacy struct {
		Files map[string]string `json:"files"`
	}
	if err := json.Unmarshal(b, &legacy); err != nil {
		return nil, fmt.Errorf("snapshot metadata %s: %w", filepath.Base(p), err)
	}
	files := legacy.Files
	legacy.Files = nil
	sn = Snapshot{}
	var rest map[string]json.RawMessage
	json.Unmarshal(b, &rest)
	delete(rest, "files")
	b, _ = json.Marshal(rest)
	if err := json.Unmarshal(b, &sn); err != nil {
		return nil, fmt.Errorf("snapshot metadata %s: %w", filepath.Base(p), err)
	}
	sn.Files = map[string]File{}
	for name, h := range files {
		chunk := h
		if !strings.HasPrefix(h, "u-") {
			chunk = "w-" + h
		}
		dst := s.chunk(chunk)
		if err := os.Rename(filepath.Join(s.dir, "blobs", h), dst); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		st, err := os.Stat(dst)
		if err != nil {
			return nil, nil // incomplete: dropped
		}
		sn.Files[name] = File{Size: st.Size(), Extents: []Extent{{Chunk: chunk, Len: st.Size()}}}
	}
	if err := s.writeMeta(sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

func (s *Store) complete(sn *Snapshot) bool {
	for c := range sn.chunks() {
		st, err := os.Stat(s.chunk(c))
		if err != nil {
			return false
		}
		s.chunkSize[c] = diskSize(st)
	}
	return len(sn.Files) > 0
}

func (s *Store) chunk(name string) string { return filepath.Join(s.dir, "chunks", name) }

// TempDir returns a new directory for a runtime to checkpoint into, on the
// same filesystem as the chunks (so adding a file whole is a rename).
func (s *Store) TempDir() (string, error) {
	return os.MkdirTemp(filepath.Join(s.dir, "tmp"), "ckpt-")
}

// NewID returns a fresh snapshot ID.
func NewID() string {
	b := make([]byte, idBytes)
	rand.Read(b)
	return idPrefix + hex.EncodeToString(b)
}

const (
	idPrefix = "snap-"
	idBytes  = 8
)

// ValidID checks that id is a snapshot ID as NewID makes them: "snap-"
// and 16 lower-case hex digits. An ID names files of the store
// (meta/<id>.json, index/<id>/), so one from elsewhere (another node) is
// used only if it passes.
func ValidID(id string) error {
	body, ok := strings.CutPrefix(id, idPrefix)
	if ok && len(body) == 2*idBytes && strings.Trim(body, "0123456789abcdef") == "" {
		return nil
	}
	return errdefs.Invalid("snapshot ID %q: want %q and %d lower-case hex digits", id, idPrefix, 2*idBytes)
}

func (s *Store) writeMeta(sn Snapshot) error {
	sn.InUse, sn.Chunks = 0, nil
	b, err := json.MarshalIndent(sn, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.dir, "meta", sn.ID+".json"), b, 0o600)
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
	c.InUse = s.refs.N(id)
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
		c.InUse = s.refs.N(sn.ID)
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
		c.InUse = s.refs.N(sn.ID)
		out = append(out, c)
	}
	return out
}

// Delete removes a snapshot that no running sandbox and no child snapshot
// needs, and the blobs no other snapshot shares.
func (s *Store) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.snaps[id]; !ok {
		return errdefs.NotFound("snapshot %q does not exist", id)
	}
	if n := s.refs.N(id); n > 0 {
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
	os.RemoveAll(filepath.Join(s.dir, "index", id))
	for c := range sn.chunks() {
		s.chunkRefs[c]--
		s.dropIfUnusedLocked(c)
	}
	return nil
}

// dropIfUnusedLocked removes a chunk no snapshot references or is about to.
func (s *Store) dropIfUnusedLocked(c string) {
	if s.chunkRefs[c] > 0 || s.pins[c] > 0 {
		return
	}
	delete(s.chunkRefs, c)
	delete(s.pins, c)
	delete(s.chunkSize, c)
	os.Remove(s.chunk(c))
}

// removeUnused deletes chunks and page indexes no snapshot references (left
// by a crash mid-snapshot or mid-delete).
func (s *Store) removeUnused() {
	entries, _ := os.ReadDir(filepath.Join(s.dir, "chunks"))
	for _, e := range entries {
		if s.chunkRefs[e.Name()] == 0 {
			os.Remove(filepath.Join(s.dir, "chunks", e.Name()))
		}
	}
	entries, _ = os.ReadDir(filepath.Join(s.dir, "index"))
	for _, e := range entries {
		if _, ok := s.snaps[e.Name()]; !ok {
			os.RemoveAll(filepath.Join(s.dir, "index", e.Name()))
		}
	}
	os.RemoveAll(filepath.Join(s.dir, "blobs")) // the format before chunks, converted by load
}

// StoredBytes is the disk the snapshots' chunks take, each chunk counted
// once however many snapshots share it.
func (s *Store) StoredBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storedLocked()
}

func (s *Store) storedLocked() int64 {
	var n int64
	for c, refs := range s.chunkRefs {
		if refs > 0 {
			n += s.chunkSize[c]
		}
	}
	return n
}

// Policy bounds the disk use of snapshots. The retention policy collects
// only agentenv's own snapshots (KindAuto); a user's are kept until
// deleted, and Admit refuses a new one when they alone fill the limits.
type Policy struct {
	MaxAge   time.Duration // 0: no age limit
	MaxCount int           // 0: no count limit
	MaxBytes int64         // 0: no size limit
}

// SetPolicy sets the limits Admit holds new user snapshots to (the same
// the server's collector applies with GC).
func (s *Store) SetPolicy(p Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policy = p
}

// GC deletes agentenv's own unreferenced snapshots (no running sandbox, no
// child) beyond the policy, oldest first, and returns the IDs it deleted.
// Internal snapshots left over from an interrupted fork always go; the
// server's ready snapshots and a user's never do.
func (s *Store) GC(p Policy) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gcLocked(p, 0)
}

// gcLocked is GC leaving room for extra more snapshots under the count
// limit.
func (s *Store) gcLocked(p Policy, extra int) []string {
	var deleted []string
	for {
		var all []*Snapshot
		total := s.storedLocked() // shared chunks count once
		for _, sn := range s.snaps {
			all = append(all, sn)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].CreatedAt.Before(all[j].CreatedAt) })
		var victim *Snapshot
		for _, sn := range all {
			if sn.Kind == KindUser || s.refs.N(sn.ID) > 0 || s.hasChild(sn.ID) {
				continue
			}
			tooOld := p.MaxAge > 0 && time.Since(sn.CreatedAt) > p.MaxAge
			tooMany := p.MaxCount > 0 && len(all)+extra > p.MaxCount
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

// Admit makes room for one more user snapshot under the policy: it
// collects agentenv's own snapshots first, and refuses (insufficient
// storage) when what is left still fills the count or byte limit, rather
// than deleting a user's snapshot. release gives the room back; call it
// once the snapshot is stored or given up.
func (s *Store) Admit() (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.policy
	s.gcLocked(p, s.admitted+1)
	// Counted as listed: the server's ready snapshots and a fork's
	// passing checkpoint are not the user's to delete.
	n := s.admitted
	for _, sn := range s.snaps {
		if !sn.Internal {
			n++
		}
	}
	if p.MaxCount > 0 && n >= p.MaxCount {
		return nil, errdefs.InsufficientStorage("the snapshot store is full: it holds %d snapshots of its %d (--snapshot-max-count), and snapshots users made are kept until deleted: delete snapshots you no longer need (`agentenv snapshot delete ID`, DELETE /snapshots/ID), or ask the operator to raise --snapshot-max-count",
			n, p.MaxCount)
	}
	if b := s.storedLocked(); p.MaxBytes > 0 && b >= p.MaxBytes {
		return nil, errdefs.InsufficientStorage("the snapshot store is full: its snapshots take %d MiB of its %d MiB (--snapshot-max-bytes), and snapshots users made are kept until deleted: delete snapshots you no longer need (`agentenv snapshot delete ID`, DELETE /snapshots/ID), or ask the operator to raise --snapshot-max-bytes",
			b>>20, p.MaxBytes>>20)
	}
	s.admitted++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.admitted--
			s.mu.Unlock()
		})
	}, nil
}

func (s *Store) hasChild(id string) bool {
	for _, other := range s.snaps {
		if other.Parent == id {
			return true
		}
	}
	return false
}

// Manifest returns a snapshot as it is sent to another node: with the
// size of each chunk it references (Chunks), which the receiver bounds
// its downloads by. Internal snapshots do not travel: their chunks are
// not named by their content, so no receiver could check them.
func (s *Store) Manifest(id string) (Snapshot, error) {
	sn, err := s.Get(id)
	if err != nil {
		return Snapshot{}, err
	}
	if sn.Internal {
		return Snapshot{}, errdefs.NotFound("snapshot %q is internal to this node", id)
	}
	sn.InUse = 0
	sn.Chunks = map[string]int64{}
	for c := range sn.chunks() {
		st, err := os.Stat(s.chunk(c))
		if err != nil {
			return Snapshot{}, errdefs.NotFound("snapshot %q chunk %s: %v", id, c, err)
		}
		sn.Chunks[c] = st.Size()
	}
	return sn, nil
}

// ChunkPath returns the path of a chunk of a snapshot (to copy it to
// another node). The file may go away once the snapshot is deleted.
func (s *Store) ChunkPath(id, chunk string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok {
		return "", errdefs.NotFound("snapshot %q does not exist on this node", id)
	}
	if !sn.chunks()[chunk] {
		return "", errdefs.NotFound("snapshot %q has no chunk %q", id, chunk)
	}
	return s.chunk(chunk), nil
}
