package sandbox

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// zeros reads as an endless stream, as a sandbox's huge sparse file does.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestReceiveFilesIsCapped(t *testing.T) {
	for _, tt := range []struct {
		sb        Sandbox
		wantLimit int64
	}{
		{Sandbox{DiskMB: 64, MemoryMB: 512}, 128 << 20},
		{Sandbox{DiskMB: 1024}, 1152 << 20},
		{Sandbox{MemoryMB: 256}, 320 << 20}, // write layer in memory
	} {
		if _, got := filesCap(tt.sb); got != tt.wantLimit {
			t.Errorf("filesCap(disk %d, memory %d) = %d MiB, want %d MiB", tt.sb.DiskMB, tt.sb.MemoryMB, got>>20, tt.wantLimit>>20)
		}
	}
	dir := t.TempDir()
	sb := Sandbox{DiskMB: 64}
	_, limit := filesCap(sb)
	dst := filepath.Join(dir, "endless")
	err := receiveFiles(dst, zeros{}, sb)
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "pause with its memory") {
		t.Errorf("endless stream: %v, want ErrTooLarge saying what to do", err)
	}
	if st, err := os.Stat(dst); err != nil {
		t.Fatal(err)
	} else if st.Size() > limit+1 {
		t.Errorf("endless stream stored %d bytes, want at most %d", st.Size(), limit+1)
	}
	small := filepath.Join(dir, "small")
	if err := receiveFiles(small, io.LimitReader(zeros{}, limit), sb); err != nil {
		t.Errorf("stream of exactly the cap: %v", err)
	}
}
