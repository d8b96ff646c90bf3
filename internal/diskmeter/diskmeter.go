// Package diskmeter charges what a stream writes to disk while it writes
// it: an upload, a tar being unpacked, a volume write. The host's disk
// admission (sandbox.Disk) hands out meters; the packages that write take
// an Open and charge every chunk before writing it, so the first refusal
// stops the stream at once instead of after the disk is full. It must not
// know what is charged against: that is the admission's.
package diskmeter

import "io"

// Meter counts the bytes one stream writes.
type Meter interface {
	// Charge admits n more bytes before they are written; an error
	// (errdefs.ErrInsufficientStorage) says why they do not fit and what
	// to do, and the stream must stop and remove what it wrote.
	Charge(n int64) error
	// Close gives back every charge, once what the stream wrote counts
	// on its own (a file in a measured directory) or was removed. Safe to
	// call more than once.
	Close()
}

// Open starts a meter for what (words for a refusal: "an upload of COPY
// files"). A nil Open meters nothing.
type Open func(what string) Meter

// Start is o(what), or a meter that admits everything when o is nil.
func (o Open) Start(what string) Meter {
	if o == nil {
		return none{}
	}
	return o(what)
}

type none struct{}

func (none) Charge(int64) error { return nil }
func (none) Close()             {}

// Writer charges each write to m before passing it to w; a refused charge
// writes nothing of that chunk and returns the refusal.
func Writer(w io.Writer, m Meter) io.Writer { return &writer{w: w, m: m} }

type writer struct {
	w io.Writer
	m Meter
}

func (w *writer) Write(p []byte) (int, error) {
	if err := w.m.Charge(int64(len(p))); err != nil {
		return 0, err
	}
	return w.w.Write(p)
}

// ReadFrom keeps io.Copy's buffer size (no sendfile: every byte is
// charged).
func (w *writer) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	return io.CopyBuffer(struct{ io.Writer }{w}, r, buf)
}

// Reader charges each read's bytes to m before returning them, for a
// stream copied to disk whose writer cannot be wrapped; a refused charge
// returns the refusal instead of the bytes.
func Reader(r io.Reader, m Meter) io.Reader { return &reader{r: r, m: m} }

type reader struct {
	r io.Reader
	m Meter
}

func (r *reader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		if cerr := r.m.Charge(int64(n)); cerr != nil {
			return 0, cerr
		}
	}
	return n, err
}
