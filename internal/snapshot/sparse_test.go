package snapshot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

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
	const size = 4 * PageSize
	page := bytes.Repeat([]byte{7}, PageSize)
	for _, tc := range []struct {
		name    string
		stream  []byte
		peerLie bool // ErrBadStream: not retried
		ok      bool
	}{
		{"exact", sparseStream(dataFrame(page), zeroFrame(2*PageSize), dataFrame(page)), false, true},
		{"trailing hole", sparseStream(dataFrame(page), zeroFrame(3*PageSize)), false, true},
		{"giant hole", sparseStream(zeroFrame(1 << 62)), true, false},
		{"hole past the end", sparseStream(dataFrame(page), zeroFrame(3*PageSize+1)), true, false},
		{"data past the end", sparseStream(zeroFrame(3*PageSize), dataFrame(append(page, 1))), true, false},
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
			err = ReadSparse(f, bytes.NewReader(tc.stream), 0, size)
			if got := err == nil; got != tc.ok {
				t.Fatalf("readSparse: %v, want ok = %v", err, tc.ok)
			}
			if got := errors.Is(err, ErrBadStream); got != tc.peerLie {
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
	data := make([]byte, 3*PageSize+10)
	copy(data[PageSize:], "data after a hole")
	src := filepath.Join(f.TempDir(), "src")
	os.WriteFile(src, data, 0o600)
	sf, _ := os.Open(src)
	var enc bytes.Buffer
	WriteSparse(&enc, sf, 0)
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
		err = ReadSparse(out, bytes.NewReader(stream), off, size)
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
