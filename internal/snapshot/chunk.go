package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// PageSize is the unit of deduplication. gVisor's pages file holds memory
// page by page, and successive checkpoints of one sandbox keep most pages
// but shift runs of them by a few pages (measured: a 1 MiB change moved
// the 64 MiB that followed by 15 pages), so fixed chunks larger than a page
// share almost nothing while pages share all but what changed.
const PageSize = 4096

// A chunk is a file under chunks/ holding pages back to back. Its name is
// the SHA-256 of the concatenated SHA-256s of its pages (one pass over the
// data yields both the dedupe keys and the name), "z-<sha256 of its bytes>"
// for a small file stored compressed (see compressed.go), "w-<sha256 of the whole
// file>" for a file stored before chunking, or "u-..." for an internal
// snapshot's file (not hashed, never shared).

// pageHashes returns the SHA-256 of every page of b (the last may be
// short), hashing on every core.
func pageHashes(b []byte) [][32]byte {
	n := (len(b) + PageSize - 1) / PageSize
	out := make([][32]byte, n)
	workers := min(runtime.NumCPU(), max(1, n/256))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				out[i] = sha256.Sum256(b[i*PageSize : min((i+1)*PageSize, len(b))])
			}
		})
	}
	wg.Wait()
	return out
}

// chunkName names a chunk by the hashes of its pages.
func chunkName(pages [][32]byte) string {
	h := sha256.New()
	for i := range pages {
		h.Write(pages[i][:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ValidChunkName reports whether name can be a chunk's file name.
func ValidChunkName(name string) bool {
	body := name
	switch {
	case strings.HasPrefix(name, "w-"), strings.HasPrefix(name, "z-"):
		body = name[2:]
	case strings.HasPrefix(name, "u-"):
		return len(name) > 2 && !strings.ContainsAny(name, "/\\") && name != "u-." && name != "u-.."
	}
	if len(body) != 64 {
		return false
	}
	_, err := hex.DecodeString(body)
	return err == nil
}

// contentAddressed reports whether name is a chunk name that says its
// content (all but the internal "u-" chunks, named at random).
func contentAddressed(name string) bool {
	return ValidChunkName(name) && !strings.HasPrefix(name, "u-")
}

// VerifyChunk checks that the file at p holds the content its name says.
// An internal chunk, named at random, cannot be checked: it is refused.
func VerifyChunk(name, p string) error {
	if !contentAddressed(name) {
		return fmt.Errorf("chunk %q is not named by its content: it cannot be checked", name)
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var got string
	switch {
	case strings.HasPrefix(name, "w-"), strings.HasPrefix(name, "z-"):
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		got = name[:2] + hex.EncodeToString(h.Sum(nil))
	default:
		// Hashed as the store names it: mapped, page by page, on every core.
		m, err := mapChunk(p)
		if err != nil {
			return err
		}
		got = chunkName(pageHashes(m))
		if len(m) > 0 {
			unix.Munmap(m)
		}
	}
	if got != name {
		return fmt.Errorf("chunk %s holds other content (%s)", name, got)
	}
	return nil
}

// loc is where a page is stored.
type loc struct {
	chunk string
	off   int64
}

// plan is how one file is stored: its extents, and the pages it needs in
// a new chunk (indexes into the file's pages).
type plan struct {
	extents  []Extent
	newPages []int
}

// planFile lays out a file of size bytes with the given page hashes: pages
// found in base are referenced where they are; the rest go into one new
// chunk (named later: its name depends on them), at their own offset when
// inPlace (the chunk is the file with the shared pages punched out), else
// packed in order.
func planFile(size int64, pages [][32]byte, base map[[32]byte]loc, inPlace bool) plan {
	var p plan
	for i := range pages {
		n := min(int64(PageSize), size-int64(i)*PageSize)
		l, ok := base[pages[i]]
		if !ok {
			l = loc{chunk: "", off: int64(len(p.newPages)) * PageSize}
			if inPlace {
				l.off = int64(i) * PageSize
			}
			p.newPages = append(p.newPages, i)
		}
		p.extents = appendExtent(p.extents, Extent{Chunk: l.chunk, Off: l.off, Len: n})
	}
	return p
}

// sharedRuns returns the byte ranges [off, off+len) of the pages of a file
// that are not new (newPages is sorted).
func sharedRuns(size int64, npages int, newPages []int) [][2]int64 {
	var runs [][2]int64
	next := 0
	start := -1
	for i := 0; i <= npages; i++ {
		isNew := next < len(newPages) && newPages[next] == i
		if isNew {
			next++
		}
		if i < npages && !isNew {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			from := int64(start) * PageSize
			runs = append(runs, [2]int64{from, min(int64(i)*PageSize, size) - from})
			start = -1
		}
	}
	return runs
}

var zeroPage = sha256.Sum256(make([]byte, PageSize))

// zeroHash is the hash of n zero bytes (a page punched out of a chunk).
func zeroHash(n int64) [32]byte {
	if n == PageSize {
		return zeroPage
	}
	return sha256.Sum256(make([]byte, n))
}

// diskSize is what a file takes on disk: a chunk with the pages it shares
// punched out takes only its new pages.
func diskSize(st os.FileInfo) int64 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return st.Size()
}

// appendExtent adds e, merging it into the last extent when it continues it.
func appendExtent(ext []Extent, e Extent) []Extent {
	if k := len(ext) - 1; k >= 0 && ext[k].Chunk == e.Chunk && ext[k].Off+ext[k].Len == e.Off {
		ext[k].Len += e.Len
		return ext
	}
	return append(ext, e)
}

// locations maps each page of a stored file (hashes in file order) to
// where its content is, for later files to reference.
func locations(into map[[32]byte]loc, f File, pages [][32]byte) {
	i := 0
	for _, e := range f.Extents {
		if compressed(e.Chunk) {
			return // its bytes are not where its pages are
		}
		for o := int64(0); o < e.Len && i < len(pages); o += PageSize {
			if _, ok := into[pages[i]]; !ok {
				into[pages[i]] = loc{chunk: e.Chunk, off: e.Off + o}
			}
			i++
		}
	}
}

// CopySparse copies r into f from offset off, leaving holes where r has
// zero pages (a chunk's punched-out pages arrive as zeros), and returns
// the bytes copied. The file ends at off plus that even when r ends in
// zeros.
func CopySparse(f *os.File, r io.Reader, off int64) (int64, error) {
	buf := make([]byte, 64*PageSize)
	var n int64
	for {
		k, err := readFull(r, buf)
		for b := 0; b < k; b += PageSize {
			blk := buf[b:min(b+PageSize, k)]
			if !AllZero(blk) {
				if _, werr := f.WriteAt(blk, off+n); werr != nil {
					return n, werr
				}
			}
			n += int64(len(blk))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, err // a cut transfer: the caller resumes from the file's end
		}
	}
	if st, err := f.Stat(); err == nil && st.Size() < off+n {
		return n, f.Truncate(off + n)
	}
	return n, nil
}

// readFull is io.ReadFull except that it returns io.EOF, not
// io.ErrUnexpectedEOF, at the reader's clean end (an HTTP body cut short
// says io.ErrUnexpectedEOF itself, and that must stay an error).
func readFull(r io.Reader, buf []byte) (int, error) {
	k := 0
	for k < len(buf) {
		n, err := r.Read(buf[k:])
		k += n
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// AllZero reports whether b holds only zero bytes (a page to leave as a
// hole).
func AllZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
