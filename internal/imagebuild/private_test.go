package imagebuild_test

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/imagebuild"
)

// A build's layers keep the uids and setuid bits its sandbox gave them,
// and so live where only root can reach them, even after something
// opened the cache's modes (a chmod -R, a volume's group ownership): a
// restarted builder closes them again, and a host user can reach neither
// a setuid-root file nor one owned by uid 1000.
func TestBuildLayersRootOnly(t *testing.T) {
	e := newEnv(t, true)
	spec := imagebuild.Spec{Name: "owners", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"cp /usr/bin/true /usr/bin/suid-true && chmod 4755 /usr/bin/suid-true && " +
			"mkdir -p /home/u && echo x > /home/u/f && chown -R 1000:1000 /home/u", "root"}},
	}}
	if _, lines, err := e.prepare(context.Background(), spec); err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, strings.Join(lines, "\n"))
	}
	// Open every mode on the way, as a recursive chmod would.
	for p := filepath.Dir(e.dir); p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o755)
	}
	if out, err := exec.Command("chmod", "-R", "go+rX", e.dir).CombinedOutput(); err != nil {
		t.Fatalf("chmod -R: %v: %s", err, out)
	}
	e.reopen(e.cfg)

	var found []string
	filepath.WalkDir(e.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid == 1000 && fi.Mode().IsRegular() || fi.Mode()&os.ModeSetuid != 0 && strings.HasSuffix(p, "suid-true") {
			found = append(found, p)
		}
		return nil
	})
	if len(found) < 2 {
		t.Fatalf("found %d of the layer's setuid and uid-1000 files under %s, want both: %v", len(found), e.dir, found)
	}
	for _, p := range found {
		if !behindPrivateDir(e.dir, p) {
			t.Errorf("%s: no directory on its way from %s is root's alone (0700)", p, e.dir)
		}
		cmd := exec.Command("stat", "--", p)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("host uid 1000 reached %s:\n%s", p, out)
		}
	}
}

// behindPrivateDir tells whether some directory from top down to p's
// parent is owned by root with no access for group or others.
func behindPrivateDir(top, p string) bool {
	for d := filepath.Dir(p); strings.HasPrefix(d, top); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil && fi.Sys().(*syscall.Stat_t).Uid == 0 && fi.Mode().Perm()&0o077 == 0 {
			return true
		}
		if d == top {
			break
		}
	}
	return false
}
