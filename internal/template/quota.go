package template

import (
	"archive/tar"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Template storage quotas: an 11.9 MB gzip upload can expand to 2.6 GiB,
// so templates have a count and a size limit. A build
// charges what it writes as it writes it, against the templates' own quota
// (Options.MaxTemplateBytes) and the host's disk budget (Options.Reserve);
// a refused charge stops the build, whose staging directory is removed.

// imageFactor is what a template takes per byte of root tree: the tree
// stays beside its EROFS image (RefreshEnvd rebuilds the image from it),
// and the image, uncompressed (noinline_data), is about the tree's size.
const imageFactor = 2

// reserveChunk is the least a build reserves of the disk budget at a time:
// each reservation sums the host's use, so not one per file.
const reserveChunk = 64 << 20

// entryCost is what one tar entry takes on disk, as a file system
// allocates it: file data in 4 KiB blocks, and an inode (a directory: a
// block) even when empty, so that a million empty files count too.
func entryCost(typeflag byte, size int64) int64 {
	const block = 4 << 10
	if typeflag == tar.TypeDir {
		return block
	}
	return (size+block-1)/block*block + 512
}

// DiskUsage is the disk a tree takes: allocated blocks (a sparse file
// counts what it holds), each hard-linked file once; what cannot be read
// counts nothing.
func DiskUsage(dir string) int64 {
	var n int64
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := inode{uint64(st.Dev), st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// quotaLocked refuses a build of name that would pass the template count,
// or start with the templates' byte quota already used up. A rebuild
// replaces its template: it adds none to the count, and the old one's
// bytes are not held against it. Callers hold s.mu.
func (s *Store) quotaLocked(name string) error {
	_, rebuild := s.templates[name]
	if max := s.opts.MaxTemplates; max > 0 && !rebuild {
		n := len(s.templates)
		for b := range s.building {
			if _, ok := s.templates[b]; !ok && b != name {
				n++
			}
		}
		if n >= max {
			return errdefs.InsufficientStorage("this server holds its most templates (%d with builds in progress; its operator's --max-templates is %d): delete a template first (agentenv template delete NAME)", n, max)
		}
	}
	if max := s.opts.MaxTemplateBytes; max > 0 {
		if used := s.storedLocked() - s.bytes[name] + s.pending; used >= max {
			return s.bytesQuotaErr(name, used, 0)
		}
	}
	return nil
}

func (s *Store) bytesQuotaErr(name string, used, more int64) error {
	need := ""
	if more > 0 {
		need = fmt.Sprintf(", and this build needs %s more", human(more))
	}
	return errdefs.InsufficientStorage("template %q: templates (with what builds in progress wrote) take %s of their %s quota (the operator's --max-template-bytes)%s: delete templates, or make this one smaller",
		name, human(used), human(s.opts.MaxTemplateBytes), need)
}

// human writes n bytes in binary units ("512 B", "1.5 KiB", "64.0 MiB").
func human(n int64) string {
	if n < 1<<10 {
		return fmt.Sprintf("%d B", n)
	}
	f, units := float64(n)/(1<<10), "KMGTPE"
	for i := 0; ; i++ {
		if f < 1<<10 || i == len(units)-1 {
			return fmt.Sprintf("%.1f %ciB", f, units[i])
		}
		f /= 1 << 10
	}
}

// buildBytes is what one build has charged: against the templates' quota
// (Store.pending) and the host's disk budget (reservations). Close gives
// it all back, once the template counts on its own (Store.bytes) or is
// gone.
type buildBytes struct {
	s        *Store
	name     string
	charged  int64
	reserved int64
	releases []func()
}

func (s *Store) newBuildBytes(name string) *buildBytes { return &buildBytes{s: s, name: name} }

// charge counts n more bytes of the template being built.
func (b *buildBytes) charge(n int64) error {
	if n <= 0 {
		return nil
	}
	s := b.s
	s.mu.Lock()
	if max := s.opts.MaxTemplateBytes; max > 0 {
		if used := s.storedLocked() - s.bytes[b.name] + s.pending; used+n > max {
			s.mu.Unlock()
			return b.s.bytesQuotaErr(b.name, used, n)
		}
	}
	s.pending += n
	s.mu.Unlock()
	b.charged += n
	if s.opts.Reserve == nil || b.charged <= b.reserved {
		return nil
	}
	need := b.charged - b.reserved
	what := fmt.Sprintf("template %q (%s written so far, counting its image)", b.name, human(b.charged))
	chunk := max(need, reserveChunk)
	release, err := s.opts.Reserve(what, chunk)
	if err != nil && chunk > need {
		chunk = need
		release, err = s.opts.Reserve(what, chunk)
	}
	if err != nil {
		return err
	}
	b.releases = append(b.releases, release)
	b.reserved += chunk
	return nil
}

// chargeTo charges the difference when the template is found to take
// total bytes, more than charged so far.
func (b *buildBytes) chargeTo(total int64) error {
	return b.charge(total - b.charged)
}

// close gives back every charge.
func (b *buildBytes) close() {
	b.s.mu.Lock()
	b.s.pending -= b.charged
	b.s.mu.Unlock()
	b.charged = 0
	for _, r := range b.releases {
		r()
	}
	b.releases, b.reserved = nil, 0
}

// watch charges the growth of dir (times imageFactor) every interval while
// a tool writes it (debootstrap), and cancels ctx's work with the refusal
// when a charge fails. stop ends the watch and returns that refusal, if
// any.
func (b *buildBytes) watch(dir string, interval time.Duration, cancel context.CancelCauseFunc) (stop func() error) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	var refused error
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if err := b.chargeTo(imageFactor * DiskUsage(dir)); err != nil {
				refused = err
				cancel(err)
				return
			}
		}
	}()
	return func() error {
		close(done)
		wg.Wait()
		return refused
	}
}

// chargeWriter charges what passes through it (a copied image) before it
// is written.
type chargeWriter struct{ b *buildBytes }

func (w chargeWriter) Write(p []byte) (int, error) {
	if err := w.b.charge(int64(len(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// fileSize is the size of a host file (0 if it cannot be read).
func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}
