package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// A template is a stack of read-only EROFS images: its own image on top of
// its lowers (Template.Lowers, top first), gVisor's root overlay over all
// of them (runtime.Spec.Lowers). A flat template is a stack of one. Lowers
// are stored once by their bytes' SHA-256 under layersDir, so every
// template built from one base shares the base's image on disk and in the
// page cache. A template's own image becomes a layer (a hard link, no
// bytes) the first time a template is built on it. A layer stays while a
// template stacks on it, a sandbox or build holds it, or a snapshot was
// taken on it (Options of SetRetainLayers); SweepRetired removes the rest.

// layersDir holds the layers by digest, beside the templates (its name
// starts with '.', so no template can have it).
const layersDir = ".layers"

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// IsDigest says whether d can name a layer (a SHA-256 in lower-case hex).
func IsDigest(d string) bool { return digestRE.MatchString(d) }

// LayerPath is where the layer with SHA-256 digest lives.
func (s *Store) LayerPath(digest string) string {
	return filepath.Join(s.dir, layersDir, "sha256-"+digest+".erofs")
}

// LayerPaths are the files of the layers digests name, in their order.
func (s *Store) LayerPaths(digests []string) []string {
	if len(digests) == 0 {
		return nil
	}
	out := make([]string, len(digests))
	for i, d := range digests {
		out[i] = s.LayerPath(d)
	}
	return out
}

// HasLayer says whether the layer with this digest is stored.
func (s *Store) HasLayer(digest string) bool {
	_, err := os.Stat(s.LayerPath(digest))
	return err == nil
}

// SetRetainLayers sets what says whether a snapshot was taken on a layer
// (the server asks its snapshots); such a layer outlives every template
// that stacked on it.
func (s *Store) SetRetainLayers(retain func(digest string) bool) {
	s.mu.Lock()
	s.retainLayer = retain
	s.mu.Unlock()
}

// Stack is a template's image with the layers below it.
type Stack struct {
	// Image is the path of the top image; ImageID names it (images.go).
	Image   string
	ImageID string
	// Lowers are the digests of the layers below Image, top first;
	// LowerPaths their files.
	Lowers     []string
	LowerPaths []string
}

// AcquireStack is AcquireImage with the layers below the image: the
// template's current stack (imageID ""), or the one a snapshot was taken
// on (its imageID and lowers). The layers are held, with the template,
// until release. A layer that is gone is a NotFound naming it.
func (s *Store) AcquireStack(name, imageID string, lowers []string) (Stack, func(), error) {
	path, id, release, err := s.AcquireImage(name, imageID)
	if err != nil {
		return Stack{}, nil, err
	}
	if imageID == "" {
		s.mu.Lock()
		if t, ok := s.templates[name]; ok {
			lowers = slices.Clone(t.Lowers)
		}
		s.mu.Unlock()
	}
	for _, d := range lowers {
		if !digestRE.MatchString(d) {
			release()
			return Stack{}, nil, errdefs.Invalid("layer %q of template %q is no SHA-256 digest", d, name)
		}
		if !s.HasLayer(d) {
			release()
			return Stack{}, nil, errdefs.NotFound("layer sha256:%s below template %q's image is gone (no template stacks on it and nothing kept it): start from the template instead", d[:12], name)
		}
	}
	drop := s.holdLayers(lowers)
	var once sync.Once
	return Stack{Image: path, ImageID: id, Lowers: lowers, LowerPaths: s.LayerPaths(lowers)}, func() {
		once.Do(func() { drop(); release() })
	}, nil
}

// HoldLayers keeps the layers digests name until release (a sandbox
// recovered after a restart, which booted on them).
func (s *Store) HoldLayers(digests []string) (release func()) { return s.holdLayers(digests) }

func (s *Store) holdLayers(digests []string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.layerRefs.Hold(digests...)
}

// BuildStack is what a build on template name stacks on: the template's
// own image made a layer, then its lowers (digests, top first, and their
// files). They are held, with the template, until release.
func (s *Store) BuildStack(name string) (digests, paths []string, release func(), err error) {
	_, rel, err := s.Acquire(name)
	if err != nil {
		return nil, nil, nil, err
	}
	d, err := s.ownLayer(name)
	if err != nil {
		rel()
		return nil, nil, nil, err
	}
	s.mu.Lock()
	digests = append([]string{d}, s.templates[name].Lowers...)
	drop := s.layerRefs.Hold(digests...)
	s.mu.Unlock()
	// The sweep may have taken the own layer between its link and the
	// hold (no template stacks on it yet): now held, link it again.
	if err := s.linkLayer(s.ImagePath(name), d); err != nil {
		drop()
		rel()
		return nil, nil, nil, err
	}
	for _, l := range digests[1:] {
		if !s.HasLayer(l) {
			drop()
			rel()
			return nil, nil, nil, fmt.Errorf("template %q: its layer sha256:%s is missing from %s", name, l, filepath.Join(s.dir, layersDir))
		}
	}
	var once sync.Once
	return digests, s.LayerPaths(digests), func() { once.Do(func() { drop(); rel() }) }, nil
}

// ownLayer makes the template's own image a layer (a hard link named by
// its digest) and returns the digest; the template's metadata keeps it.
// The caller holds the template.
func (s *Store) ownLayer(name string) (string, error) {
	s.mu.Lock()
	t := *s.templates[name]
	s.mu.Unlock()
	image := s.ImagePath(name)
	if t.Digest == "" {
		d, err := fileDigest(image)
		if err != nil {
			return "", fmt.Errorf("template %q image: %w", name, err)
		}
		t.Digest = d
		t.InUse = 0
		b, _ := json.MarshalIndent(t, "", "  ")
		if err := atomicfile.WriteFile(filepath.Join(s.dir, name, "template.json"), b, 0o644); err != nil {
			return "", err
		}
		s.mu.Lock()
		s.templates[name].Digest = d
		s.mu.Unlock()
	}
	if err := s.linkLayer(image, t.Digest); err != nil {
		return "", err
	}
	return t.Digest, nil
}

// linkLayer makes file the layer digest (a hard link) unless it is stored.
func (s *Store) linkLayer(file, digest string) error {
	dst := s.LayerPath(digest)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	if err := os.Link(file, dst); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// LayerFromTree makes the tree (a pulled image's root) a layer with
// envd and the sandbox conventions installed (prepareRootfs, on an
// overlay: the tree is not changed), held until release. So a thin
// template on it stores no envd of its own. hint is a file beside the
// tree naming the layer made from it before, with the envd it has: while
// that layer is stored and the envd is current, it is used again (images
// are not byte-reproducible, so the tree alone does not name it). A new
// layer is charged (about the tree's size) before it is written.
func (s *Store) LayerFromTree(ctx context.Context, tree, hint string, charge func(int64) error) (digest string, release func(), err error) {
	if b, err := os.ReadFile(hint); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 && IsDigest(f[0]) && f[1] == s.envdHash && s.HasLayer(f[0]) {
			drop := s.holdLayers([]string{f[0]})
			if s.HasLayer(f[0]) { // not swept in between
				return f[0], drop, nil
			}
			drop()
		}
	}
	if err := charge(DiskUsage(tree)); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(filepath.Join(s.dir, layersDir), 0o700); err != nil {
		return "", nil, err
	}
	scratch, err := os.MkdirTemp(s.dir, ".build-layer-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(scratch)
	upper, work, merged := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work"), filepath.Join(scratch, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return "", nil, err
		}
	}
	if err := MountOverlay([]string{tree}, upper, work, merged); err != nil {
		return "", nil, err
	}
	tmp := filepath.Join(s.dir, layersDir, ".in-"+filepath.Base(scratch))
	defer os.Remove(tmp)
	err = refusedPath(prepareRootfs(merged, s.envd))
	if err == nil {
		// As thin layers: no xattrs (gVisor opens no file that has one),
		// no tail-packed data.
		var out []byte
		if out, err = exec.CommandContext(ctx, "mkfs.erofs", "-x", "-1", "-E", "noinline_data", tmp, merged).CombinedOutput(); err != nil {
			err = fmt.Errorf("mkfs.erofs of the base image: %w: %s", err, lastLines(string(out)))
		}
	}
	if uerr := Unmount(merged); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if err != nil {
		return "", nil, err
	}
	d, err := fileDigest(tmp)
	if err != nil {
		return "", nil, err
	}
	drop := s.holdLayers([]string{d})
	if !s.HasLayer(d) {
		if err := atomicfile.Rename(tmp, s.LayerPath(d)); err != nil {
			drop()
			return "", nil, err
		}
	}
	if err := atomicfile.WriteFile(hint, []byte(d+" "+s.envdHash+"\n"), 0o600); err != nil {
		drop()
		return "", nil, err
	}
	s.mu.Lock()
	s.retired = s.extraBytesLocked()
	s.mu.Unlock()
	return d, drop, nil
}

// AdoptLayer stores a layer copied from elsewhere (a fleet peer): its
// bytes must have the digest, or nothing is kept. A stored layer is not
// copied again.
func (s *Store) AdoptLayer(digest string, r io.Reader) error {
	if !digestRE.MatchString(digest) {
		return errdefs.Invalid("layer %q: not a SHA-256 digest", digest)
	}
	if s.HasLayer(digest) {
		return nil
	}
	dst := s.LayerPath(digest)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(dst), ".in-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy layer sha256:%s: %w", digest[:12], err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return errdefs.Unavailable("layer sha256:%s arrived corrupt (sha256 %s)", digest[:12], got)
	}
	if err := atomicfile.Rename(f.Name(), dst); err != nil {
		return err
	}
	s.mu.Lock()
	s.retired = s.extraBytesLocked()
	s.mu.Unlock()
	return nil
}

// sweepLayers removes the layers no template stacks on, nothing holds and
// no snapshot needs. Callers hold no lock.
func (s *Store) sweepLayers() {
	ents, err := os.ReadDir(filepath.Join(s.dir, layersDir))
	if err != nil {
		return
	}
	s.mu.Lock()
	retain := s.retainLayer
	used := map[string]bool{}
	for _, t := range s.templates {
		for _, d := range t.Lowers {
			used[d] = true
		}
	}
	s.layerRefs.Each(func(d string, _ int) { used[d] = true })
	s.mu.Unlock()
	for _, e := range ents {
		d, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), "sha256-"), ".erofs")
		if !ok || !digestRE.MatchString(d) {
			if strings.HasPrefix(e.Name(), ".in-") {
				os.Remove(filepath.Join(s.dir, layersDir, e.Name()))
			}
			continue
		}
		if used[d] || (retain != nil && retain(d)) {
			continue
		}
		os.Remove(filepath.Join(s.dir, layersDir, e.Name()))
	}
}

// extraBytesLocked is the disk the store's images outside the templates'
// directories take: retired images and layers, each file once, none that
// is still a template's image.erofs (counted with its template).
func (s *Store) extraBytesLocked() int64 {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	for name := range s.templates {
		var st syscall.Stat_t
		if syscall.Stat(s.ImagePath(name), &st) == nil {
			seen[inode{uint64(st.Dev), st.Ino}] = true
		}
	}
	var n int64
	for _, d := range []string{retiredDir, layersDir} {
		ents, err := os.ReadDir(filepath.Join(s.dir, d))
		if err != nil {
			continue
		}
		for _, e := range ents {
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join(s.dir, d, e.Name()), &st) != nil {
				continue
			}
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				continue
			}
			seen[k] = true
			n += st.Blocks * 512
		}
	}
	return n
}

// sharedLocked is the disk of a template's lower layers (shared with the
// templates stacked on the same ones, counted once in the store's total).
func (s *Store) sharedLocked(t *Template) int64 {
	var n int64
	for _, d := range t.Lowers {
		var st syscall.Stat_t
		if syscall.Stat(s.LayerPath(d), &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// fileDigest is the SHA-256 of a file, in hex.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
