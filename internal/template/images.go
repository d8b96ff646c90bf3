package template

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
)

// A snapshot restores only on the very image its sandbox booted from:
// gVisor checks the EROFS image it reopens against the one it saved, and
// even the image's path (a spec annotation). A template's image changes
// when the template is rebuilt or gets a new envd (RefreshEnvd), so every
// image has an ImageID (a digest of its bytes, Template.ImageID) that
// sandboxes and snapshots record, and sandboxes boot from a path naming
// it: retiredDir/<template>.<imageID>.erofs, a hard link to the image made
// when it is written. When the template moves on, that link stays as long
// as a snapshot names the image (Options.Retain, asked by SweepRetired),
// so the snapshot still restores on the same path and bytes. Templates and
// snapshots made before image IDs use the template's image.erofs, as
// before.

// retiredDir holds the images by ID, beside the templates (its name
// starts with '.', so no template can have it).
const retiredDir = ".images"

func (s *Store) retiredPath(name, imageID string) string {
	return filepath.Join(s.dir, retiredDir, name+"."+imageID+".erofs")
}

// linkImage makes the path by ID of the image dir/image.erofs of template
// name.
func (s *Store) linkImage(name, dir, imageID string) error {
	dst := s.retiredPath(name, imageID)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	src := filepath.Join(dir, "image.erofs")
	err := os.Link(src, dst)
	if !errors.Is(err, os.ErrExist) {
		return err
	}
	// The same bytes under the same ID (a rebuild from the same inputs):
	// the link becomes one of the new file, so the old one's blocks go
	// with the old template instead of staying, counted, in retiredDir.
	a, aerr := os.Stat(src)
	b, berr := os.Stat(dst)
	if aerr != nil || berr != nil || os.SameFile(a, b) {
		return nil
	}
	tmp := dst + ".new"
	os.Remove(tmp)
	if err := os.Link(src, tmp); err != nil {
		return err
	}
	return atomicfile.Rename(tmp, dst)
}

// SetRetain sets what decides whether an image a template is leaving is
// still needed (a snapshot was taken on it). The server sets it once its
// snapshots are open; before that, and with none, images are not kept.
func (s *Store) SetRetain(retain func(template, imageID string) bool) {
	s.mu.Lock()
	s.retain = retain
	s.mu.Unlock()
}

// AcquireImage is Acquire of a given image of the template: its current
// one, or (imageID names an older one) the retired image a snapshot was
// taken on. imageID "" is the current image. It returns the image's path
// and ID; the template cannot be rebuilt or deleted until release.
func (s *Store) AcquireImage(name, imageID string) (path, id string, release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.templates[name]
	if !ok {
		return "", "", nil, errdefs.NotFound("template %q does not exist (list them with `agentenv template list`)", name)
	}
	path, id = s.ImagePath(name), t.ImageID
	if imageID != "" {
		id = imageID
	}
	if id != "" {
		path = s.retiredPath(name, id)
		if _, err := os.Stat(path); err != nil {
			if id == t.ImageID {
				// Its link went missing (removed by hand): make it again.
				if err := s.linkImage(name, filepath.Join(s.dir, name), id); err != nil {
					return "", "", nil, err
				}
			} else {
				return "", "", nil, errdefs.NotFound("the image of template %q this was saved on (%s) is gone: the template was rebuilt and nothing kept the old image; start from the template instead", name, imageID)
			}
		}
	}
	return path, id, s.refs.Hold(name), nil
}

// SweepRetired removes the retired images no snapshot needs any more, and
// those of templates that are gone. It returns how many it removed.
func (s *Store) SweepRetired() int {
	s.mu.Lock()
	retain := s.retain
	s.mu.Unlock()
	// No retired image yet is no reason to keep unused layers: the
	// directory's absence only means there is nothing to remove from it.
	ents, _ := os.ReadDir(filepath.Join(s.dir, retiredDir))
	n := 0
	for _, e := range ents {
		base, ok := strings.CutSuffix(e.Name(), ".erofs")
		i := strings.LastIndexByte(base, '.')
		if !ok || i < 0 {
			continue
		}
		name, id := base[:i], base[i+1:]
		s.mu.Lock()
		t, exists := s.templates[name]
		current := exists && t.ImageID == id
		// A sandbox restored on an old image holds the template (refs):
		// the image stays until it is gone, as a template's own does.
		busy := exists && s.refs.N(name) > 0
		s.mu.Unlock()
		if current || busy || (exists && retain != nil && retain(name, id)) {
			continue
		}
		if os.Remove(filepath.Join(s.dir, retiredDir, e.Name())) == nil {
			n++
		}
	}
	s.sweepLayers()
	s.mu.Lock()
	s.retired = s.extraBytesLocked()
	s.mu.Unlock()
	return n
}
