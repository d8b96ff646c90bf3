package snapshot

import (
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// A checkpoint's state file (checkpoint.img, ~0.2 MiB for a small
// sandbox) differs all through from one checkpoint to the next (measured:
// no page and no content-defined chunk in common) but compresses ~3x, and
// an incremental snapshot of a sandbox that changed 1 MiB stores it every
// time. Small files stored whole are therefore kept deflated, in a "z-"
// chunk named by the SHA-256 of its (compressed) bytes; a restore inflates
// them. Pages files are not: they are large, mostly shared, and restores
// link them.
const (
	maxCompressed = 4 << 20 // larger files are stored as they are
	minSaving     = 4       // compress only when it saves at least 1/minSaving
)

func compressed(chunk string) bool { return strings.HasPrefix(chunk, "z-") }

// compress deflates data into a new file p and returns the chunk's name,
// or "" when it does not pay.
func compress(p string, data []byte) (string, error) {
	if len(data) > maxCompressed {
		return "", nil
	}
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, flate.BestSpeed)
	if err != nil {
		return "", err
	}
	w.Write(data)
	if err := w.Close(); err != nil {
		return "", err
	}
	if buf.Len() > len(data)-len(data)/minSaving {
		return "", nil
	}
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		return "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return "z-" + hex.EncodeToString(sum[:]), nil
}

// inflate writes the content of compressed chunk p (size bytes) to out.
func inflate(out io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	r := flate.NewReader(f)
	defer r.Close()
	// A chunk copied from another node is checked against its name, not
	// what it inflates to: read one byte past the size, no more.
	n, err := io.Copy(out, io.LimitReader(r, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("compressed chunk %s inflates to other than %d bytes (%d read)", p, size, n)
	}
	return nil
}
