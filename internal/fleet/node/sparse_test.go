package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/snapshot"
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

	const clusterSecret = "s3cret-s3cret-s3cret"
	var calls, wire atomic.Int64
	var lastRange atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if secret.NewVerifier(clusterSecret).Verify(r) != nil {
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

	n := &Node{cfg: Config{Secret: clusterSecret}, auth: secret.NewAuth(clusterSecret), log: slog.Default(), http: &http.Client{Transport: nodepb.NewTransport(nil)}}
	peer := store.NodeRecord{Name: "peer", Addr: strings.TrimPrefix(srv.URL, "http://")}
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
