// Package template builds and stores templates: a read-only EROFS root image
// shared by every sandbox started from it, with envd baked in. It must not
// start sandboxes; it only hands out images and counts who uses them.
package template

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/refcount"
)

// EnvdPath is where envd lives inside every template.
const EnvdPath = "/.agentenv/envd"

// CodeInterpreterPath is where a code interpreter template has the server.
const CodeInterpreterPath = "/.agentenv/codeinterp"

// CodeInterpreterPackages are the Debian packages a code interpreter
// template is built from at least: Python with an IPython kernel and the
// data libraries notebooks expect.
var CodeInterpreterPackages = []string{"python3", "python-is-python3", "python3-pip", "python3-ipykernel",
	"python3-matplotlib-inline", "python3-numpy", "python3-pandas", "python3-matplotlib", "ca-certificates", "procps",
	// debootstrap follows no virtual package (Provides): these provide what
	// python3-zmq (python3-cffi-backend-api-*) and the tools scipy brings
	// (libboost-regex1.74.0-icu72) depend on.
	"python3-cffi-backend", "libboost-regex1.74.0"}

// codeInterpreterStart is a code interpreter template's start command and
// ready check: ready once the default Python kernel answers.
var codeInterpreterStart = Start{StartCmd: CodeInterpreterPath, ReadyCmd: CodeInterpreterPath + " -check", ReadyTimeout: 180}

// Template is a stored, built template.
type Template struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Packages  []string  `json:"packages,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	ImageSize int64     `json:"imageSize"`
	EnvdHash  string    `json:"envdHash"`
	// ImageID names the template's image by its bytes (a digest): what a
	// snapshot of its sandboxes was taken on (images.go). Empty for images
	// made before IDs.
	ImageID string `json:"imageID,omitempty"`
	// Digest is the SHA-256 of the image (ImageID is its start): its name
	// as a layer other templates stack on (layers.go). Empty for images
	// made before layers until one is built on it.
	Digest string `json:"digest,omitempty"`
	// Lowers are the layers below the image (SHA-256 digests, top first):
	// the image holds only what the template's build changed over them.
	// None: a flat template, its image the whole root.
	Lowers []string `json:"lowers,omitempty"`
	// OwnBytes is the disk the template's own files take, SharedBytes
	// that of its lowers, which templates built on the same base share
	// (not persisted).
	OwnBytes    int64 `json:"ownBytes"`
	SharedBytes int64 `json:"sharedBytes"`
	// Defaults and Start are the template's process settings (see settings.go).
	Defaults
	Start
	// DiskMB is the write-layer size of the template's sandboxes (0: the
	// server's default).
	DiskMB int `json:"diskMB,omitempty"`
	// Owner is the name of the API key that built the template; "" for
	// the operator's (and the single key's), which every key shares. Any
	// key may start sandboxes from a template; only its owner (or the
	// operator) may rebuild, retag or delete it.
	Owner string `json:"owner,omitempty"`
	// Size is the CPUs and memory of the template's sandboxes.
	Size
	// InUse is the number of sandboxes using the template (not persisted).
	InUse int `json:"inUse"`
}

// ChangeableBy says whether the caller a key name stands for may rebuild,
// retag or delete t: the operator and the single key ("") may change any
// template, a named key only its own. The refusal is ErrPermissionDenied:
// the template is visible and usable to every key, so a 404 would lie.
func (t Template) ChangeableBy(owner string) error {
	if owner == "" || t.Owner == owner {
		return nil
	}
	whose := "another API key"
	if t.Owner == "" {
		whose = "the server's operator"
	}
	return fmt.Errorf("template %q belongs to %s: you may start sandboxes from it (or build from it with fromTemplate), but not rebuild, retag or delete it; build your own under another name: %w", t.Name, whose, errdefs.ErrPermissionDenied)
}

// UsableByImage says whether t may stand for the image ref in a build by
// owner's key (fromImage): only a template imported by the operator, or
// by owner itself, does. A label is whatever its uploader typed, so
// another key's label never names an image for someone else.
func (t Template) UsableByImage(ref, owner string) bool {
	return t.Source == "oci:"+ref && (t.Owner == "" || t.Owner == owner)
}

// Progress is one step of a template build.
type Progress struct {
	Phase   string  `json:"phase"`
	Percent float64 `json:"percent"`
	Message string  `json:"message,omitempty"`
}

// BuildRequest says what to build. Exactly one source is set. It comes
// from API clients, who may hold a key but not the host: nothing in it may
// name a host resource beyond the operator's Options.
type BuildRequest struct {
	Name string `json:"name"`
	// Debian suite (e.g. bookworm), built with debootstrap from the
	// operator's mirror with signatures checked.
	Debian   string   `json:"debian,omitempty"`
	Packages []string `json:"packages,omitempty"`
	// Mirror is refused: the mirror is the operator's choice
	// (Options.DebianMirror). It is kept to answer with a clear error.
	Mirror string `json:"mirror,omitempty"`
	// Rootfs is a directory or a tarball inside the operator's
	// Options.ImportDir (a path relative to it, or an absolute one inside).
	Rootfs string `json:"rootfs,omitempty"`
	// Busybox builds the tiny busybox template from the host's busybox-static.
	Busybox bool `json:"busybox,omitempty"`
	// Upload is a rootfs tar stream (plain or gzip) sent by the client.
	Upload io.Reader `json:"-"`
	// Image names the OCI image an upload was flattened from (a label
	// kept as the template's source, "oci:IMAGE"); with Tree, what the
	// steps started from ("steps:IMAGE").
	Image string `json:"image,omitempty"`
	// Tree is a root filesystem the server prepared itself (the step
	// builder's result): a directory on the store's filesystem, moved
	// (renamed) into the build. Never from a client, hence json:"-".
	Tree string `json:"-"`
	// Lowers, with Tree, are the layers Tree is a tree of changes over
	// (digests, top first, from BuildStack): the template is thin. Set by
	// the server only.
	Lowers []string `json:"-"`
	// Defaults and Start are the template's process settings (see settings.go).
	Defaults
	Start
	// DiskMB is the write-layer size of the template's sandboxes in MiB
	// (0: the server's default).
	DiskMB int `json:"diskMB,omitempty"`
	// Owner is the API key name the build is for ("": the operator).
	// The server sets it from the caller's key, never from a client's
	// body; a named key's build of a name another key owns is refused.
	// The operator's rebuild keeps the template's owner.
	Owner string `json:"owner,omitempty"`
	// Size is the CPUs and memory of the template's sandboxes.
	Size
	// CodeInterpreter installs the code interpreter server (E2B's
	// /execute API on port 49999, backed by IPython kernels) and makes it
	// the template's start command; the tree must have python3 with
	// ipykernel (CodeInterpreterPackages).
	CodeInterpreter bool `json:"codeInterpreter,omitempty"`
}

// Size is what a sandbox of the template gets when its create asks for
// no CPUs or memory of its own (E2B's template cpuCount and memoryMB).
// Zero fields: the server's defaults. The server's maximum caps both when
// a sandbox starts: the template does not know the server it runs on.
type Size struct {
	CPUs     int `json:"cpuCount,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
}

// check validates a size from a client.
func (z Size) check() error {
	if z.CPUs < 0 || z.CPUs > 64 {
		return errdefs.Invalid("cpuCount %d: give 1 to 64, or 0 for the server's default", z.CPUs)
	}
	if z.MemoryMB < 0 || (z.MemoryMB > 0 && z.MemoryMB < 64) || z.MemoryMB > 1<<20 {
		return errdefs.Invalid("memoryMB %d: give at least 64, or 0 for the server's default", z.MemoryMB)
	}
	return nil
}

// MaxDiskMB bounds any write layer (1 TiB), the operator's --disk-mb and
// --max-disk-mb included: the layer is a sparse file, so the bound is about
// the host's disk, not its memory.
const MaxDiskMB = 1 << 20

// DefaultMaxDiskMB is the default cap on a client's diskMB (10 GiB, the
// default --disk-mb): every sandbox's layer counts at its full size
// against the disk budget, so a client's choice is the operator's to bound.
const DefaultMaxDiskMB = 10 << 10

// checkDiskMB checks a client's diskMB against the operator's cap.
func (s *Store) checkDiskMB(mb int) error {
	if mb < 0 || (mb > 0 && mb < 64) || mb > s.opts.MaxDiskMB {
		return errdefs.Invalid("diskMB %d out of range: give 64..%d MiB (this server's --max-disk-mb), or 0 for the server's default", mb, s.opts.MaxDiskMB)
	}
	return nil
}

// Options are the operator's choices for template builds.
type Options struct {
	// ImportDir is the only host directory builds may read a rootfs from
	// (BuildRequest.Rootfs); empty: none.
	ImportDir string
	// DebianMirror is the mirror debootstrap uses (default: the host's apt
	// mirror). Its Release files must be signed by a key in DebianKeyring.
	DebianMirror string
	// DebianKeyring is the keyring signatures are checked against (default:
	// /usr/share/keyrings/debian-archive-keyring.gpg).
	DebianKeyring string
	// MaxUploadBytes bounds the file data of an uploaded rootfs (0: 8 GiB).
	MaxUploadBytes int64
	// MaxDiskMB caps the diskMB a build request may set (0:
	// DefaultMaxDiskMB; at most MaxDiskMB).
	MaxDiskMB int
	// MaxTemplates caps how many templates the store holds, builds of new
	// names included (0: no limit).
	MaxTemplates int
	// MaxTemplateBytes caps the disk all templates take together (root
	// trees and images; 0: no limit). A build that would pass it is
	// stopped while it writes.
	MaxTemplateBytes int64
	// Reserve, if set, admits bytes a build is writing against the host's
	// disk (its reserve and budget) and holds them until release, when
	// the template counts on its own (the server passes
	// sandbox.Disk.Charge); a refusal stops the build.
	Reserve func(what string, bytes int64) (release func(), err error)
	// CodeInterpreter is the code interpreter server's binary (cmd/codeinterp)
	// that BuildRequest.CodeInterpreter installs; empty: such builds are refused.
	CodeInterpreter string
}

// DefaultKeyring is Debian's archive keyring (package debian-archive-keyring).
const DefaultKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName reports whether name can name a template.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid("template name %q: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Store holds the templates under one directory.
type Store struct {
	dir      string
	envd     string
	envdHash string
	opts     Options
	log      *slog.Logger

	mu        sync.Mutex
	templates map[string]*Template
	refs      *refcount.Counts[string] // sandboxes on each template
	building  map[string]bool
	// bytes is the disk each stored template takes; pending what builds
	// in progress have charged (see buildBytes).
	bytes   map[string]int64
	pending int64
	// retain says whether a snapshot needs a template's image (images.go);
	// retired is the disk the kept images take.
	retain  func(template, imageID string) bool
	retired int64
	// layerRefs counts the sandboxes and builds holding each layer;
	// retainLayer says whether a snapshot needs one (layers.go).
	layerRefs   *refcount.Counts[string]
	retainLayer func(digest string) bool
}

// Open loads the templates stored under dir with the default Options (no
// import directory). envd is the path of the envd binary baked into every
// image.
func Open(dir, envd string, log *slog.Logger) (*Store, error) {
	return OpenWithOptions(dir, envd, Options{}, log)
}

// OpenWithOptions is Open with the operator's build options.
func OpenWithOptions(dir, envd string, opts Options, log *slog.Logger) (*Store, error) {
	// Templates are the operator's and their users': no other host user
	// reads them.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if opts.DebianMirror == "" {
		opts.DebianMirror = DefaultMirror()
	}
	if opts.DebianKeyring == "" {
		opts.DebianKeyring = DefaultKeyring
	}
	if opts.MaxUploadBytes <= 0 {
		opts.MaxUploadBytes = 8 << 30
	}
	if opts.MaxDiskMB <= 0 {
		opts.MaxDiskMB = DefaultMaxDiskMB
	}
	opts.MaxDiskMB = min(opts.MaxDiskMB, MaxDiskMB)
	if opts.ImportDir != "" {
		d, err := filepath.EvalSymlinks(opts.ImportDir)
		if err != nil {
			return nil, fmt.Errorf("import dir: %w", err)
		}
		if opts.ImportDir, err = filepath.Abs(d); err != nil {
			return nil, err
		}
	}
	hash, err := fileHash(envd)
	if err != nil {
		return nil, fmt.Errorf("envd binary %s: %w (run `make build`)", envd, err)
	}
	s := &Store{dir: dir, envd: envd, envdHash: hash, opts: opts, log: log,
		templates: map[string]*Template{}, building: map[string]bool{}, bytes: map[string]int64{}}
	s.refs = refcount.New[string](&s.mu, nil)
	s.layerRefs = refcount.New[string](&s.mu, nil)

	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if e.Name() == retiredDir || e.Name() == layersDir {
			continue
		}
		if !nameRE.MatchString(e.Name()) {
			// A build that died half-way (".build-*", ".old-*"): remove it,
			// and first the layers it had mounted.
			if err := unmountUnder(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
			os.RemoveAll(filepath.Join(dir, e.Name()))
			continue
		}
		// An envd update that died half-way may have left layers mounted.
		if err := unmountUnder(filepath.Join(dir, e.Name(), "mnt")); err != nil {
			return nil, err
		}
		os.RemoveAll(filepath.Join(dir, e.Name(), "mnt"))
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "template.json"))
		if err != nil {
			log.Warn("removing incomplete template", "template", e.Name(), "err", err)
			os.RemoveAll(filepath.Join(dir, e.Name()))
			continue
		}
		var t Template
		if err := json.Unmarshal(b, &t); err != nil {
			return nil, fmt.Errorf("template %s metadata: %w", e.Name(), err)
		}
		s.templates[t.Name] = &t
		s.bytes[t.Name] = DiskUsage(filepath.Join(dir, e.Name()))
	}
	s.retired = s.extraBytesLocked()
	return s, nil
}

// DiskBytes is the disk the stored templates take (root trees and images;
// builds in progress hold reservations of their own).
func (s *Store) DiskBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.storedLocked()
}

func (s *Store) storedLocked() int64 {
	var n int64
	for _, b := range s.bytes {
		n += b
	}
	return n + s.retired
}

// ImagePath is the EROFS image of a template.
func (s *Store) ImagePath(name string) string { return filepath.Join(s.dir, name, "image.erofs") }

func (s *Store) rootfsPath(name string) string { return filepath.Join(s.dir, name, "rootfs") }

// RootfsPath is the root tree a template's image was made from (read it,
// never write it: the image would no longer match).
func (s *Store) RootfsPath(name string) string { return s.rootfsPath(name) }

// Dir is the directory the store keeps its templates in.
func (s *Store) Dir() string { return s.dir }

// List returns every template, sorted by name.
func (s *Store) List() []Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Template, 0, len(s.templates))
	for _, t := range s.templates {
		out = append(out, s.copyLocked(t))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns one template.
func (s *Store) Get(name string) (Template, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.templates[name]
	if !ok {
		return Template{}, errdefs.NotFound("template %q does not exist (list them with `agentenv template list`)", name)
	}
	return s.copyLocked(t), nil
}

// copyLocked is a copy of t with the counts that are not persisted.
func (s *Store) copyLocked(t *Template) Template {
	c := *t
	c.Lowers = slices.Clone(t.Lowers)
	c.InUse = s.refs.N(t.Name)
	c.OwnBytes = s.bytes[t.Name]
	c.SharedBytes = s.sharedLocked(t)
	return c
}

// Acquire marks the template as used by one more sandbox and returns its
// image path and a release function (safe to call more than once).
func (s *Store) Acquire(name string) (string, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.templates[name]; !ok {
		return "", nil, errdefs.NotFound("template %q does not exist (list them with `agentenv template list`)", name)
	}
	return s.ImagePath(name), s.refs.Hold(name), nil
}

// Delete removes a template that no sandbox uses, and the layers only it
// stacked on unless a snapshot needs them.
func (s *Store) Delete(name string) error {
	s.mu.Lock()
	if _, ok := s.templates[name]; !ok {
		s.mu.Unlock()
		return errdefs.NotFound("template %q does not exist", name)
	}
	if n := s.refs.N(name); n > 0 {
		s.mu.Unlock()
		return errdefs.Conflict("template %q is used by %d sandbox(es): kill them first", name, n)
	}
	if s.building[name] {
		s.mu.Unlock()
		return errdefs.Conflict("template %q is being built", name)
	}
	delete(s.templates, name)
	delete(s.bytes, name)
	err := os.RemoveAll(filepath.Join(s.dir, name))
	s.mu.Unlock()
	s.SweepRetired()
	return err
}

// EnsureBusybox builds the busybox template if it is missing or carries an
// older envd.
func (s *Store) EnsureBusybox(ctx context.Context) error {
	t, err := s.Get("busybox")
	if err == nil && t.EnvdHash == s.envdHash {
		return nil
	}
	if err == nil && t.InUse > 0 {
		return nil
	}
	s.log.Info("building busybox template")
	_, err = s.Build(ctx, BuildRequest{Name: "busybox", Busybox: true}, func(Progress) {})
	return err
}

// RefreshEnvd rebuilds the image of every template whose envd is older than
// the current binary, so all sandboxes speak the same protocol.
func (s *Store) RefreshEnvd(ctx context.Context) error {
	for _, t := range s.List() {
		if t.EnvdHash == s.envdHash || t.InUse > 0 {
			continue
		}
		s.log.Info("updating envd in template", "template", t.Name)
		if len(t.Lowers) > 0 {
			if err := extractImage(ctx, filepath.Join(s.dir, t.Name)); err != nil {
				return fmt.Errorf("update envd in template %s: %w", t.Name, err)
			}
		}
		if err := s.finish(ctx, t.Name, filepath.Join(s.dir, t.Name), &t, func(Progress) {}); err != nil {
			return fmt.Errorf("update envd in template %s: %w", t.Name, err)
		}
		t.InUse = 0
		n := DiskUsage(filepath.Join(s.dir, t.Name))
		s.mu.Lock()
		s.templates[t.Name] = &t
		s.bytes[t.Name] = n
		s.mu.Unlock()
	}
	s.SweepRetired()
	return nil
}

func fileHash(path string) (string, error) {
	d, err := fileDigest(path)
	if err != nil {
		return "", err
	}
	return d[:16], nil
}
