// Package volume owns persistent volumes: named directories on this host
// that outlive sandboxes, mounted read-write into the sandboxes that name
// them, with E2B's volume content API (list, stat, read, write, mkdir,
// remove, chmod/chown) served on them from outside any sandbox.
//
// It keeps one directory per volume under its root: volume.json (the
// record) and data/ (the contents). It must not know about sandboxes,
// HTTP or the fleet: who mounts a volume is asked of the caller through
// InUse, and the API layer maps its error classes (errdefs) to HTTP.
package volume

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/diskmeter"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/refcount"
	"github.com/agentenv/agentenv/internal/template"
)

// Volume is a volume's record.
type Volume struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Owner   string    `json:"owner,omitempty"`
	Created time.Time `json:"created"`
	// SizeMB is the volume's size limit (its ext4 image, disk.go); 0: a
	// plain directory without one.
	SizeMB int64 `json:"sizeMB,omitempty"`
}

// Config configures a Store.
type Config struct {
	// Dir holds the volumes (created if missing).
	Dir string
	// MaxVolumes caps how many volumes may exist (0: 100).
	MaxVolumes int
	// SizeMB is the size limit of each new volume: its contents live in
	// an ext4 image of that size (disk.go). 0 makes plain directories
	// without a limit.
	SizeMB int64
	// InUse, if set, names the sandboxes that mount volume id now: Delete
	// refuses while it names any.
	InUse func(id string) []string
	// Meter, if set, admits what the content API writes (and a new
	// volume's file system) against the host's disk, chunk by chunk.
	Meter diskmeter.Open
}

// Store creates, lists and deletes volumes and serves their contents.
type Store struct {
	cfg Config
	key []byte // signs volume tokens

	mu   sync.Mutex
	vols map[string]Volume
	// roots holds an open os.Root per volume's data directory: every
	// content operation goes through it, so no path (.., symlinks) leaves
	// the volume.
	roots map[string]*os.Root
	// held counts, per volume, the creates that resolved it and have not
	// yet registered their sandbox (Hold): Delete refuses meanwhile, as
	// InUse cannot see them yet.
	held *refcount.Counts[string]
}

var nameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,63}$`)

// Open loads the volumes under cfg.Dir.
func Open(cfg Config) (*Store, error) {
	if cfg.MaxVolumes <= 0 {
		cfg.MaxVolumes = 100
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	key, err := loadKey(filepath.Join(cfg.Dir, ".token-key"))
	if err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, key: key, vols: map[string]Volume{}, roots: map[string]*os.Root{}}
	s.held = refcount.New[string](&s.mu, nil)
	ents, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(cfg.Dir, e.Name(), "volume.json"))
		if err != nil {
			// A create that died before its record was written: nothing
			// was handed out, so its directory goes (its image unmounted
			// first, or the removal would empty a live mount).
			if unmountDisk(filepath.Join(cfg.Dir, e.Name())) == nil {
				os.RemoveAll(filepath.Join(cfg.Dir, e.Name()))
			}
			continue
		}
		var v Volume
		if err := json.Unmarshal(b, &v); err != nil || v.ID != e.Name() {
			return nil, fmt.Errorf("volume record %s: unreadable (%v); move the directory away to drop it", e.Name(), err)
		}
		if hasDisk(filepath.Join(cfg.Dir, v.ID)) {
			ctx, cancel := context.WithTimeout(context.Background(), diskTimeout)
			err := mountDisk(ctx, filepath.Join(cfg.Dir, v.ID))
			cancel()
			if err != nil {
				return nil, fmt.Errorf("volume %s (%s): %w", v.Name, v.ID, err)
			}
		}
		s.vols[v.ID] = v
	}
	return s, nil
}

func loadKey(path string) ([]byte, error) {
	if b, err := os.ReadFile(path); err == nil && len(b) == 32 {
		return b, nil
	}
	b := make([]byte, 32)
	rand.Read(b)
	return b, atomicfile.WriteFile(path, b, 0o600)
}

// Close releases the open volume roots and unmounts the images of the
// volumes no sandbox mounts (those that one does stay mounted for it; the
// next Open finds them mounted).
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.roots {
		r.Close()
		delete(s.roots, id)
	}
	for id := range s.vols {
		if s.held.N(id) > 0 || (s.cfg.InUse != nil && len(s.cfg.InUse(id)) > 0) {
			continue
		}
		unmountDisk(filepath.Join(s.cfg.Dir, id))
	}
}

// Create makes an empty volume called name for owner. Names are unique
// per owner.
func (s *Store) Create(owner, name string) (Volume, error) {
	if !nameRE.MatchString(name) {
		return Volume{}, errdefs.Invalid("invalid volume name %q: use 1 to 63 letters, digits, '_' or '-'", name)
	}
	// A new file system's metadata (the image is sparse: what mkfs
	// writes) needs room on the host. Charged before the store's lock:
	// the charge may measure what the volumes hold (DiskBytes), which
	// takes that lock.
	meter := s.cfg.Meter.Start(fmt.Sprintf("volume %q", name))
	defer meter.Close()
	if err := meter.Charge(newVolumeBytes); err != nil {
		return Volume{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vols {
		if v.Owner == owner && v.Name == name {
			return Volume{}, errdefs.Invalid("volume with name '%s' already exists", name)
		}
	}
	if len(s.vols) >= s.cfg.MaxVolumes {
		return Volume{}, errdefs.Conflict("this host holds %d volumes, its limit (--max-volumes): delete one first", len(s.vols))
	}
	v := Volume{ID: newID(), Name: name, Owner: owner, Created: time.Now().UTC(), SizeMB: s.cfg.SizeMB}
	dir := filepath.Join(s.cfg.Dir, v.ID)
	fail := func(err error) (Volume, error) {
		if unmountDisk(dir) == nil {
			os.RemoveAll(dir)
		}
		return Volume{}, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return fail(err)
	}
	if v.SizeMB > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), diskTimeout)
		err := makeDisk(ctx, dir, v.SizeMB)
		cancel()
		if err != nil {
			return fail(err)
		}
	} else if err := os.Chmod(filepath.Join(dir, "data"), 0o777); err != nil {
		// Every user inside a sandbox may write at the top, as on E2B.
		return fail(err)
	}
	b, _ := json.Marshal(v)
	if err := atomicfile.WriteFile(filepath.Join(dir, "volume.json"), b, 0o600); err != nil {
		return fail(err)
	}
	s.vols[v.ID] = v
	return v, nil
}

// newVolumeBytes is what a new volume's file system takes on the host
// before anything is written to it (ext4 with lazy inode tables: a few
// MiB).
const newVolumeBytes = 16 << 20

// DiskBytes is what the volumes take on the host: an image volume its
// image's allocated blocks, a directory volume its files.
func (s *Store) DiskBytes() int64 {
	s.mu.Lock()
	vols := make([]Volume, 0, len(s.vols))
	for _, v := range s.vols {
		vols = append(vols, v)
	}
	s.mu.Unlock()
	var n int64
	for _, v := range vols {
		dir := filepath.Join(s.cfg.Dir, v.ID)
		if hasDisk(dir) {
			n += template.DiskUsage(filepath.Join(dir, diskImage))
		} else {
			n += template.DiskUsage(filepath.Join(dir, "data"))
		}
	}
	return n
}

// newID returns a random UUID (version 4), the shape E2B's volume IDs have.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var idRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// CheckID tells whether id has the shape of a volume ID.
func CheckID(id string) error {
	if !idRE.MatchString(id) {
		return errdefs.Invalid("invalid volume ID %q: volume IDs are UUIDs as POST /volumes returns them", id)
	}
	return nil
}

// Get returns the volume id, if owner may see it (owner "" sees all).
func (s *Store) Get(owner, id string) (Volume, error) {
	if err := CheckID(id); err != nil {
		return Volume{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vols[id]
	if !ok || (owner != "" && v.Owner != owner) {
		return Volume{}, errdefs.NotFound("volume %s not found", id)
	}
	return v, nil
}

// ByName returns owner's volume called name. Names are unique per owner,
// so the match is exact: the default key's owner "" names only its own
// volumes, not another key's of the same name.
func (s *Store) ByName(owner, name string) (Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vols {
		if v.Name == name && v.Owner == owner {
			return v, nil
		}
	}
	return Volume{}, errdefs.NotFound("volume '%s' not found", name)
}

// Volumes returns owner's volumes (all for owner ""), oldest first.
func (s *Store) Volumes(owner string) []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Volume
	for _, v := range s.vols {
		if owner == "" || v.Owner == owner {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b Volume) int { return a.Created.Compare(b.Created) })
	return out
}

// Delete removes a volume and its contents; it is refused while a
// sandbox mounts it.
func (s *Store) Delete(owner, id string) error {
	v, err := s.Get(owner, id)
	if err != nil {
		return err
	}
	// Under mu, so that a create that registers its sandbox and releases
	// its Hold cannot slip between the two checks: it is either held or
	// registered (InUse). InUse must not call back into the store.
	s.mu.Lock()
	if s.held.N(id) > 0 {
		s.mu.Unlock()
		return errdefs.Conflict("volume '%s' is being mounted by a sandbox that is starting: try again when it has started, after killing it", v.Name)
	}
	if s.cfg.InUse != nil {
		if users := s.cfg.InUse(id); len(users) > 0 {
			s.mu.Unlock()
			return errdefs.Conflict("volume '%s' is mounted by sandbox %s: kill them (or wait for them to end) before deleting it", v.Name, strings.Join(users, ", "))
		}
	}
	if r := s.roots[id]; r != nil {
		r.Close()
		delete(s.roots, id)
	}
	delete(s.vols, id)
	s.mu.Unlock()
	dir := filepath.Join(s.cfg.Dir, id)
	// The record goes first: a crash mid-removal leaves a directory
	// without a record, which Open removes.
	if err := os.Remove(filepath.Join(dir, "volume.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := unmountDisk(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// Hold keeps the volumes ids from being deleted until release is called:
// a create holds the volumes it mounts until its sandbox is registered
// (or has failed), so a delete racing it is refused rather than pulling
// the directory from under it. An unknown ID is ErrNotFound.
func (s *Store) Hold(ids ...string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.vols[id]; !ok {
			return nil, errdefs.NotFound("volume %s not found (deleted meanwhile?)", id)
		}
	}
	return s.held.Hold(ids...), nil
}

// DataDir is the host directory holding volume id's contents: what a
// sandbox mounts.
func (s *Store) DataDir(id string) string { return filepath.Join(s.cfg.Dir, id, "data") }

// root returns the open root of volume id's contents.
func (s *Store) root(id string) (*os.Root, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.vols[id]; !ok {
		return nil, errdefs.NotFound("volume %s not found", id)
	}
	if r := s.roots[id]; r != nil {
		return r, nil
	}
	r, err := os.OpenRoot(s.DataDir(id))
	if err != nil {
		return nil, err
	}
	s.roots[id] = r
	return r, nil
}

// tokenTTL is how long a volume token lets its bearer use the content API.
const tokenTTL = 24 * time.Hour

// Token returns a bearer token for volume id's content API, valid for a
// day. Tokens are signed with the store's key, not stored.
func (s *Store) Token(id string) string {
	exp := time.Now().Add(tokenTTL).Unix()
	msg := fmt.Sprintf("%s.%d", id, exp)
	return "vt_" + base64.RawURLEncoding.EncodeToString([]byte(msg)) + "." + s.sign(msg)
}

func (s *Store) sign(msg string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckToken reports whether tok grants access to volume id now.
func (s *Store) CheckToken(id, tok string) error {
	body, sig, ok := strings.Cut(strings.TrimPrefix(tok, "vt_"), ".")
	raw, err := base64.RawURLEncoding.DecodeString(body)
	vid, expS, _ := strings.Cut(string(raw), ".")
	if ok && err == nil && strings.HasPrefix(tok, "vt_") && idRE.MatchString(vid) && vid != id {
		// Said before the signature is checked, so the answer is the same
		// wherever the other volume lives (in a fleet, another node signed
		// it); the token is refused either way.
		return fmt.Errorf("the token is for another volume: %w", errdefs.ErrUnauthenticated)
	}
	if !ok || err != nil || !strings.HasPrefix(tok, "vt_") || !hmac.Equal([]byte(sig), []byte(s.sign(string(raw)))) {
		return fmt.Errorf("not a valid token for volume %s: send the token GET /volumes/{id} returns as 'Authorization: Bearer <token>': %w", id, errdefs.ErrUnauthenticated)
	}
	var exp int64
	fmt.Sscan(expS, &exp)
	if time.Now().Unix() > exp {
		return fmt.Errorf("the volume token expired: get a new one with GET /volumes/%s: %w", id, errdefs.ErrUnauthenticated)
	}
	return nil
}

// Mount is a volume mounted into a sandbox: which volume, where, and the
// host directory bound there. Sandbox and snapshot records keep it, so a
// restore or a fork child mounts the same volume.
type Mount struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Path   string `json:"path"`
	Source string `json:"source"`
}

// BindSource returns the host directory a sandbox mounting volume id
// binds: its data directory, after symlinks are resolved, which must be
// that directory of this store and nothing else (a symlink put in its
// place must not bind another part of the host into a sandbox). Every
// bind of a volume should come from here, never from a path someone
// handed over.
func (s *Store) BindSource(id string) (string, error) {
	if err := CheckID(id); err != nil {
		return "", err
	}
	s.mu.Lock()
	_, ok := s.vols[id]
	s.mu.Unlock()
	if !ok {
		return "", errdefs.NotFound("volume %s not found on this host", id)
	}
	return s.checkBind(id, s.DataDir(id))
}

// CheckBindSource returns the volume whose data directory p is, after
// symlinks are resolved; any other path (outside the store, another of
// its files, a symlink leading out of it) is refused.
func (s *Store) CheckBindSource(p string) (id string, err error) {
	if !filepath.IsAbs(p) {
		return "", errdefs.Invalid("volume bind source %q is not an absolute path: refused", p)
	}
	root, err := filepath.EvalSymlinks(s.cfg.Dir)
	if err != nil {
		return "", err
	}
	// The volume ID is the path's component below the store's directory,
	// whether p names the store by its resolved path or not.
	for _, dir := range []string{root, filepath.Clean(s.cfg.Dir)} {
		if rel, err := filepath.Rel(dir, filepath.Clean(p)); err == nil {
			if id, rest, _ := strings.Cut(rel, string(filepath.Separator)); rest == "data" && CheckID(id) == nil {
				s.mu.Lock()
				_, ok := s.vols[id]
				s.mu.Unlock()
				if ok {
					_, err := s.checkBind(id, p)
					return id, err
				}
			}
		}
	}
	return "", fmt.Errorf("%s is not the data directory of a volume of this host (%s): refused as a volume bind source: %w", p, s.cfg.Dir, errdefs.ErrPermissionDenied)
}

// checkBind resolves p and checks that it is volume id's data directory
// in this store, a directory.
func (s *Store) checkBind(id, p string) (string, error) {
	root, err := filepath.EvalSymlinks(s.cfg.Dir)
	if err != nil {
		return "", err
	}
	want := filepath.Join(root, id, "data")
	got, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("volume %s: its data directory: %w", id, err)
	}
	if got != want {
		return "", fmt.Errorf("volume %s: its data directory %s leads to %s, outside its place in the volume store (%s): not mounted; "+
			"the host's volume directory was changed, check it: %w", id, p, got, want, errdefs.ErrPermissionDenied)
	}
	if st, err := os.Lstat(got); err != nil || !st.IsDir() {
		return "", fmt.Errorf("volume %s: its data directory %s is not a directory: not mounted: %w", id, got, errdefs.ErrPermissionDenied)
	}
	return got, nil
}

// CheckMountPath checks where in a sandbox a volume is mounted: an
// absolute, clean path that is not the sandbox's own (/, /proc, /sys,
// /dev and below).
func CheckMountPath(p string) error {
	switch {
	case !strings.HasPrefix(p, "/") || path.Clean(p) != p:
		return errdefs.Invalid("volume mount path %q: give an absolute path without '.' or '..' components", p)
	case p == "/":
		return errdefs.Invalid("volume mount path / is the sandbox's root: mount the volume elsewhere, such as /mnt/data")
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if p == sys || strings.HasPrefix(p, sys+"/") {
			return errdefs.Invalid("volume mount path %s is the sandbox's own (%s and what is under it): mount the volume elsewhere, such as /mnt/data", p, sys)
		}
	}
	return nil
}
