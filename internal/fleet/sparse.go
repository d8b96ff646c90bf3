package fleet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"agentenv/internal/snapshot"
)

// Snapshot chunks are sparse: the pages a snapshot shares with its parent
// are holes. On the wire between nodes, runs of zero pages travel as a
// length, not as zeros, when both ends speak this encoding (sparseHeader
// on the request and on the answer). A frame is one kind byte, 'd' (data
// follows) or 'z' (zeros), and an 8-byte big-endian length; offsets are
// those of the file, so a broken transfer resumes with a Range request as
// a plain one does.

const sparseHeader = "X-Agentenv-Sparse"

const (
	frameData  = 'd'
	frameZeros = 'z'
)

// writeSparse sends f from off in the sparse encoding.
func writeSparse(w io.Writer, f *os.File, off int64) error {
	buf := make([]byte, 64*snapshot.PageSize)
	zeros := int64(0) // a run of zero pages not sent yet
	flushZeros := func() error {
		if zeros == 0 {
			return nil
		}
		err := writeFrame(w, frameZeros, zeros, nil)
		zeros = 0
		return err
	}
	for {
		k, err := f.ReadAt(buf, off)
		if k > 0 {
			for b := 0; b < k; {
				end := min(b+snapshot.PageSize, k)
				if snapshot.AllZero(buf[b:end]) {
					zeros += int64(end - b)
					b = end
					continue
				}
				// A run of data pages.
				for end < k && !snapshot.AllZero(buf[end:min(end+snapshot.PageSize, k)]) {
					end = min(end+snapshot.PageSize, k)
				}
				if ferr := flushZeros(); ferr != nil {
					return ferr
				}
				if ferr := writeFrame(w, frameData, int64(end-b), buf[b:end]); ferr != nil {
					return ferr
				}
				b = end
			}
			off += int64(k)
		}
		if errors.Is(err, io.EOF) {
			return flushZeros()
		}
		if err != nil {
			return err
		}
	}
}

func writeFrame(w io.Writer, kind byte, n int64, data []byte) error {
	var h [9]byte
	h[0] = kind
	binary.BigEndian.PutUint64(h[1:], uint64(n))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	if data != nil {
		_, err := w.Write(data)
		return err
	}
	return nil
}

// readSparse writes what writeSparse sent into f from off, leaving holes
// for zero runs, up to size (the file's declared size): a frame past it,
// an empty frame or an unknown kind is errPeerData, refused before
// anything of it is written. A stream cut short, or ending before size,
// is a plain error (the caller resumes from the file's end).
func readSparse(f *os.File, r io.Reader, off, size int64) error {
	if off < 0 || off > size {
		return fmt.Errorf("sparse transfer: offset %d outside the declared %d bytes", off, size)
	}
	var h [9]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			if errors.Is(err, io.EOF) {
				break // a clean end between frames
			}
			return err
		}
		n := binary.BigEndian.Uint64(h[1:])
		if h[0] != frameData && h[0] != frameZeros {
			return fmt.Errorf("sparse transfer: bad frame kind %q: %w", h[0], errPeerData)
		}
		if n == 0 || n > uint64(size-off) {
			return fmt.Errorf("sparse transfer: a %q frame of %d bytes at offset %d of the declared %d: %w", h[0], n, off, size, errPeerData)
		}
		if h[0] == frameData {
			c, err := io.Copy(io.NewOffsetWriter(f, off), io.LimitReader(r, int64(n)))
			if err != nil {
				return err
			}
			if c < int64(n) {
				return io.ErrUnexpectedEOF // the frame was cut short
			}
		}
		off += int64(n)
	}
	if st, err := f.Stat(); err == nil && st.Size() < off {
		if err := f.Truncate(off); err != nil {
			return err
		}
	}
	if off < size {
		return fmt.Errorf("sparse transfer ended at %d of the declared %d bytes: %w", off, size, io.ErrUnexpectedEOF)
	}
	return nil
}

// serveSparse answers a request that asked for the sparse encoding: the
// file from the Range's start ("bytes=N-", the only form copies send).
func serveSparse(w http.ResponseWriter, r *http.Request, f *os.File) {
	var off int64
	if rg := r.Header.Get("Range"); rg != "" {
		s, ok := strings.CutPrefix(rg, "bytes=")
		s, ok2 := strings.CutSuffix(s, "-")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || !ok2 || err != nil || n < 0 {
			http.Error(w, "sparse copies take a Range of the form bytes=N-", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		off = n
	}
	w.Header().Set(sparseHeader, "1")
	w.Header().Set("Content-Type", "application/octet-stream")
	if off > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	writeSparse(w, f, off) // a failure shows as a cut stream: the copy resumes
}
