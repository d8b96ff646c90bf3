package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// The sparse encoding carries a chunk between nodes with its holes (the
// pages a snapshot shares with its parent) as lengths, not as zeros. A
// frame is one kind byte, 'd' (data follows) or 'z' (zeros), and an
// 8-byte big-endian length; a stream starts at any offset of the file.

// ErrBadStream marks a sparse stream that is not what was declared (a
// frame past the declared size, an empty frame, an unknown kind): unlike
// a cut stream, a retry would not help.
var ErrBadStream = errors.New("sparse stream not as declared")

const (
	frameData  = 'd'
	frameZeros = 'z'
)

// WriteSparse sends f from off in the sparse encoding.
func WriteSparse(w io.Writer, f *os.File, off int64) error {
	buf := make([]byte, 64*PageSize)
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
				end := min(b+PageSize, k)
				if AllZero(buf[b:end]) {
					zeros += int64(end - b)
					b = end
					continue
				}
				// A run of data pages.
				for end < k && !AllZero(buf[end:min(end+PageSize, k)]) {
					end = min(end+PageSize, k)
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

// ReadSparse writes what WriteSparse sent into f from off, leaving holes
// for zero runs, up to size (the file's declared size): a frame past it,
// an empty frame or an unknown kind is ErrBadStream (the sender does not
// send what it declared), refused before anything of it is written. A stream cut short, or ending before size,
// is a plain error (the caller resumes from the file's end).
func ReadSparse(f *os.File, r io.Reader, off, size int64) error {
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
			return fmt.Errorf("sparse transfer: bad frame kind %q: %w", h[0], ErrBadStream)
		}
		if n == 0 || n > uint64(size-off) {
			return fmt.Errorf("sparse transfer: a %q frame of %d bytes at offset %d of the declared %d: %w", h[0], n, off, size, ErrBadStream)
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
