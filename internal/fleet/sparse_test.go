package fleet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"agentenv/internal/snapshot"
)

// countingWriter cuts the answer after limit bytes (0: never) and counts
// what went on the wire.
type countingWriter struct {
	http.ResponseWriter
	n, limit int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		p = p[:c.limit-c.n]
		c.ResponseWriter.Write(p)
		c.n += int64(len(p))
		http.NewResponseController(c.ResponseWriter).Flush()
		panic(http.ErrAbortHandler)
	}
	c.n += int64(len(p))
	return c.ResponseWriter.Write(p)
}

// A chunk with holes (the pages a snapshot shares with its parent) travels
// as its data plus the holes' lengths, resumes after a break, and lands
// sparse and byte-identical.
func TestSparseChunkCopy(t *testing.T) {
	const page = snapshot.PageSize
	src := filepath.Join(t.TempDir(), "chunk")
	f, _ := os.Create(src)
	var want bytes.Buffer
	// 64 MiB logical: data pages scattered among long zero runs, and a
	// partial page of data at the end.
	const size = 64<<20 + 100
	want.Grow(size)
	want.Write(make([]byte, size))
	b := want.Bytes()
	for _, off := range []int{0, 5 * page, 6 * page, 1000 * page, 9000 * page, 16000 * page} {
		for i := range page {
			b[off+i] = byte(off/page + i)
		}
	}
	for i := size - 100; i < size; i++ {
		b[i] = 0xAB
	}
	for off := 0; off < size; off += page {
		if end := min(off+page, size); !snapshot.AllZero(b[off:end]) {
			f.WriteAt(b[off:end], int64(off))
		}
	}
	f.Truncate(size)
	f.Close()

	const secret = "s3cret-s3cret-s3cret"
	var calls, wire atomic.Int64
	var lastRange atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !checkSecret(r, secret) {
			http.Error(w, "no secret", http.StatusUnauthorized)
			return
		}
		n := calls.Add(1)
		lastRange.Store(r.Header.Get("Range"))
		cw := &countingWriter{ResponseWriter: w}
		if n == 1 {
			cw.limit = 3*page + 40 // inside the second data frame
		}
		defer func() { wire.Add(cw.n) }()
		serveFile(cw, r, src)
	}))
	defer srv.Close()

	n := &Node{cfg: NodeConfig{Secret: secret}, log: slog.Default(), http: &http.Client{Transport: newTransport(nil)}}
	peer := NodeRecord{Name: "peer", Addr: strings.TrimPrefix(srv.URL, "http://")}
	dst := filepath.Join(t.TempDir(), "copy")
	if err := n.copyChunk(context.Background(), peer, "snap-0000000000000001", "w-x", size, dst); err != nil {
		t.Fatalf("copyChunk: %v", err)
	}
	got, _ := os.ReadFile(dst)
	if len(got) != size || sha256.Sum256(got) != sha256.Sum256(b) {
		t.Fatalf("copied %d bytes, want the identical %d", len(got), size)
	}
	if c := calls.Load(); c != 2 {
		t.Fatalf("peer asked %d times, want 2 (the break, then one resume)", c)
	}
	// The first answer broke after the data of pages 5–6: the copy's file
	// ended there, and it resumed from that offset.
	if got, want := lastRange.Load(), "bytes=28672-"; got != want {
		t.Fatalf("resume asked for Range %q, want %q", got, want)
	}
	if w := wire.Load(); w > 1<<20 {
		t.Fatalf("%d bytes on the wire for %d bytes of data in a %d-byte file: the holes travelled as zeros", w, 6*page+100, size)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dst, &st); err != nil {
		t.Fatal(err)
	}
	if alloc := st.Blocks * 512; alloc > 1<<20 {
		t.Fatalf("the copy allocates %d bytes on disk, want it sparse like its source", alloc)
	}
}

// frame is one frame of the sparse encoding (data nil: a run of zeros).
type frame struct {
	kind byte
	n    int64
	data []byte
}

func dataFrame(b []byte) frame { return frame{frameData, int64(len(b)), b} }
func zeroFrame(n int64) frame  { return frame{frameZeros, n, nil} }

// sparseStream encodes frames as writeSparse does.
func sparseStream(frames ...frame) []byte {
	var b bytes.Buffer
	for _, f := range frames {
		writeFrame(&b, f.kind, f.n, f.data)
	}
	return b.Bytes()
}

// readSparse takes no more than the declared size, refuses frames that
// would pass it before writing them, and fails a stream that ends short.
func TestReadSparseBounds(t *testing.T) {
	const size = 4 * snapshot.PageSize
	page := bytes.Repeat([]byte{7}, snapshot.PageSize)
	for _, tc := range []struct {
		name    string
		stream  []byte
		peerLie bool // errPeerData: not retried
		ok      bool
	}{
		{"exact", sparseStream(dataFrame(page), zeroFrame(2*snapshot.PageSize), dataFrame(page)), false, true},
		{"trailing hole", sparseStream(dataFrame(page), zeroFrame(3*snapshot.PageSize)), false, true},
		{"giant hole", sparseStream(zeroFrame(1 << 62)), true, false},
		{"hole past the end", sparseStream(dataFrame(page), zeroFrame(3*snapshot.PageSize+1)), true, false},
		{"data past the end", sparseStream(zeroFrame(3*snapshot.PageSize), dataFrame(append(page, 1))), true, false},
		{"length with the top bit", sparseStream(zeroFrame(-1)), true, false},
		{"empty frame", sparseStream(zeroFrame(0)), true, false},
		{"bad kind", sparseStream(frame{'x', 1, nil}), true, false},
		{"ends short", sparseStream(dataFrame(page)), false, false},
		{"data frame cut", sparseStream(dataFrame(page))[:100], false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "chunk"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			err = readSparse(f, bytes.NewReader(tc.stream), 0, size)
			if got := err == nil; got != tc.ok {
				t.Fatalf("readSparse: %v, want ok = %v", err, tc.ok)
			}
			if got := errors.Is(err, errPeerData); got != tc.peerLie {
				t.Errorf("readSparse: %v, want a peer's lie = %v", err, tc.peerLie)
			}
			st, _ := f.Stat()
			if st.Size() > size || (tc.ok && st.Size() != size) {
				t.Errorf("file of %d bytes, want %d", st.Size(), size)
			}
		})
	}
}

// FuzzReadSparse: whatever a peer sends, the file never grows past the
// declared size, and a success fills it exactly.
func FuzzReadSparse(f *testing.F) {
	data := make([]byte, 3*snapshot.PageSize+10)
	copy(data[snapshot.PageSize:], "data after a hole")
	src := filepath.Join(f.TempDir(), "src")
	os.WriteFile(src, data, 0o600)
	sf, _ := os.Open(src)
	var enc bytes.Buffer
	writeSparse(&enc, sf, 0)
	sf.Close()
	f.Add(enc.Bytes(), int64(len(data)), int64(0))
	f.Add(enc.Bytes(), int64(len(data)-1), int64(0))
	f.Add(sparseStream(zeroFrame(1<<62)), int64(100), int64(0))
	f.Add(sparseStream(dataFrame([]byte("abc"))), int64(10), int64(7))
	f.Fuzz(func(t *testing.T, stream []byte, size, off int64) {
		if size <= 0 || size > 1<<20 || off < 0 || off > size {
			return
		}
		out, err := os.Create(filepath.Join(t.TempDir(), "chunk"))
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		err = readSparse(out, bytes.NewReader(stream), off, size)
		st, serr := out.Stat()
		if serr != nil {
			t.Fatal(serr)
		}
		if st.Size() > size {
			t.Fatalf("file grew to %d bytes, past the declared %d", st.Size(), size)
		}
		if err == nil && st.Size() != size {
			t.Fatalf("success with a file of %d bytes, want %d", st.Size(), size)
		}
	})
}
