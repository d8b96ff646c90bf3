package diskmeter

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

var errFull = errors.New("full")

// limit admits up to max bytes.
type limit struct{ max, used int64 }

func (l *limit) Charge(n int64) error {
	if l.used+n > l.max {
		return errFull
	}
	l.used += n
	return nil
}
func (l *limit) Close() {}

// TestWriterStopsAtRefusal: nothing of a refused chunk is written, and the
// copy ends with the refusal.
func TestWriterStopsAtRefusal(t *testing.T) {
	var out bytes.Buffer
	m := &limit{max: 1 << 20}
	n, err := io.Copy(Writer(&out, m), io.LimitReader(strings.NewReader(strings.Repeat("x", 4<<20)), 4<<20))
	if !errors.Is(err, errFull) {
		t.Fatalf("copy of 4 MiB through a 1 MiB meter: %v, want the refusal", err)
	}
	if int64(out.Len()) != n || n > 1<<20 {
		t.Errorf("wrote %d bytes (copy says %d), want at most 1 MiB", out.Len(), n)
	}
}

// TestReaderStopsAtRefusal: a refused read returns the refusal, not bytes.
func TestReaderStopsAtRefusal(t *testing.T) {
	m := &limit{max: 1 << 20}
	n, err := io.Copy(io.Discard, Reader(strings.NewReader(strings.Repeat("x", 4<<20)), m))
	if !errors.Is(err, errFull) || n > 1<<20 {
		t.Fatalf("read %d bytes, %v; want at most 1 MiB and the refusal", n, err)
	}
}

// TestNilOpen: a nil Open meters nothing.
func TestNilOpen(t *testing.T) {
	m := Open(nil).Start("x")
	if err := m.Charge(1 << 40); err != nil {
		t.Fatal(err)
	}
	m.Close()
}
