package envd

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCommandPathSkipsTheBashShim: /bin/bash as agentenv's shim is run as
// the sh it would exec; any other /bin/bash (real bash, a changed or
// replaced shim, a symlink) and any other command are run as asked.
func TestCommandPathSkipsTheBashShim(t *testing.T) {
	dir := t.TempDir()
	bash := filepath.Join(dir, "bash")
	old := bashShimPath
	bashShimPath = bash
	t.Cleanup(func() { bashShimPath = old })

	if got := commandPath(bash); got != bash {
		t.Errorf("no /bin/bash: got %q, want it unchanged", got)
	}
	if err := os.WriteFile(bash, []byte(BashShim), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := commandPath(bash); got != shimTarget {
		t.Errorf("the shim: got %q, want %q", got, shimTarget)
	}
	if got := commandPath("/usr/bin/env"); got != "/usr/bin/env" {
		t.Errorf("another command: got %q", got)
	}
	// Same size, other content (the cache is keyed by identity and mtime).
	other := []byte(BashShim)
	other[len(other)-2] = 'x'
	if err := os.WriteFile(bash, other, 0o755); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	os.Chtimes(bash, future, future)
	if got := commandPath(bash); got != bash {
		t.Errorf("a changed shim: got %q, want it run as asked", got)
	}
	// Replaced by another file (a real bash installed over it).
	os.Remove(bash)
	if err := os.WriteFile(bash, []byte("#!/bin/sh\necho real bash\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := commandPath(bash); got != bash {
		t.Errorf("a replaced shim: got %q, want it run as asked", got)
	}
	// A symlink to a shim is not the shim agentenv wrote.
	os.Remove(bash)
	target := filepath.Join(dir, "shim")
	os.WriteFile(target, []byte(BashShim), 0o755)
	os.Symlink(target, bash)
	if got := commandPath(bash); got != bash {
		t.Errorf("a symlink: got %q, want it run as asked", got)
	}
}
