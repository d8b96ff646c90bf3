package runtimetest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
)

// diskLayer checks the write layer on disk (Spec.DiskMB): df shows its
// size, /tmp is on it, a write past it fails with ENOSPC and the sandbox
// lives on, its bytes are in the host file, a checkpoint carries them to a
// restored sandbox, and Destroy removes the file.
func diskLayer(t *testing.T, env Env, r runtime.Runtime) {
	ctx := context.Background()
	s := spec(t, env)
	s.DiskMB = 64
	if err := r.Create(ctx, s); err != nil {
		t.Fatalf("create with a 64 MiB disk layer: %v", err)
	}
	t.Cleanup(func() { r.Destroy(ctx, s.ID) })
	if out := exec(t, r, s.ID, "df -k / /tmp | tail -n 2 | awk '{print $2}'"); out != "65536\n65536\n" {
		t.Errorf("df sizes of / and /tmp: %q, want 65536 KiB each", out)
	}
	out := exec(t, r, s.ID, "dd if=/dev/urandom of=/tmp/big bs=1M count=100 2>&1; echo rc=$?")
	if !strings.Contains(out, "No space left on device") {
		t.Errorf("writing 100 MiB into 64 MiB: %q, want ENOSPC", out)
	}
	exec(t, r, s.ID, "rm /tmp/big; dd if=/dev/urandom of=/tmp/f bs=1M count=20 2>/dev/null")
	sum := exec(t, r, s.ID, "md5sum /tmp/f")
	file := ocispec.FilestorePath(s.Dir, s.ID)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatalf("layer file: %v", err)
	}
	if b := fi.Sys().(*syscall.Stat_t).Blocks * 512; b < 20<<20 || b > 48<<20 {
		// More than 48 MiB: the 64 MiB of the removed file still hold disk.
		t.Errorf("layer file %s holds %d bytes after a 64 MiB file was removed and 20 MiB written, want 20..48 MiB", file, b)
	}
	if cp, ok := r.(runtime.Checkpointer); ok {
		img := filepath.Join(env.Dir, s.ID+"-ckpt")
		if err := cp.Checkpoint(ctx, s.ID, img); err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		c := spec(t, env)
		c.DiskMB = s.DiskMB
		if err := cp.Restore(ctx, c, img); err != nil {
			t.Fatalf("restore: %v", err)
		}
		t.Cleanup(func() { r.Destroy(ctx, c.ID) })
		if got := exec(t, r, c.ID, "md5sum /tmp/f"); got != sum {
			t.Errorf("restored layer: %q, want %q", got, sum)
		}
	}
	if err := r.Destroy(ctx, s.ID); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("layer file after destroy: %v, want it gone", err)
	}
}
