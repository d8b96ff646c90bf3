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
	"path/filepath"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// errExists: the template is here already (Adopt has nothing to do).
var errExists = errors.New("template exists")

// Adopt stores a template copied from another node of a fleet: its EROFS
// image byte for byte (so that snapshots taken on either node restore on
// the other) and its metadata. sum, if set, is the image's SHA-256; a
// mismatch fails the copy and leaves nothing behind.
func (s *Store) Adopt(ctx context.Context, t Template, image io.Reader, sum string) (Template, error) {
	if err := ValidName(t.Name); err != nil {
		return Template{}, err
	}
	// A layered template's layers come first (AdoptLayer).
	for _, d := range t.Lowers {
		if !IsDigest(d) {
			return Template{}, errdefs.Invalid("template %s: layer %q is not a SHA-256 digest", t.Name, d)
		}
		if !s.HasLayer(d) {
			return Template{}, errdefs.Invalid("template %s: its layer sha256:%s is not on this node: copy the layers first", t.Name, d)
		}
	}
	release, err := s.claim(t.Name, func() error {
		if _, ok := s.templates[t.Name]; ok {
			return errExists
		}
		return s.quotaLocked(t.Name)
	})
	if errors.Is(err, errExists) {
		return s.Get(t.Name) // a copy made meanwhile
	}
	if err != nil {
		return Template{}, err
	}
	defer release()
	// The copy is charged as it arrives, as a build's files are.
	acct := s.newBuildBytes(t.Name)
	defer acct.close()
	staging, err := os.MkdirTemp(s.dir, ".build-"+t.Name+"-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(staging)
	f, err := os.OpenFile(filepath.Join(staging, "image.erofs"), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return Template{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(chargeWriter{acct}, f, h), image)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Template{}, fmt.Errorf("copying template %s image: %w", t.Name, err)
	}
	got := hex.EncodeToString(h.Sum(nil))
	if sum != "" && got != sum {
		return Template{}, errdefs.Unavailable("template %s image arrived corrupt (sha256 %s, want %s)", t.Name, got, sum)
	}
	t.ImageSize, t.InUse, t.Digest = n, 0, got
	t.OwnBytes, t.SharedBytes = 0, 0
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(staging, "template.json"), b, 0o644); err != nil {
		return Template{}, err
	}
	size := DiskUsage(staging)
	if err := os.Rename(staging, filepath.Join(s.dir, t.Name)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return s.Get(t.Name)
		}
		return Template{}, err
	}
	s.mu.Lock()
	c := t
	s.templates[t.Name] = &c
	s.bytes[t.Name] = size
	t = s.copyLocked(&c)
	s.mu.Unlock()
	return t, nil
}
