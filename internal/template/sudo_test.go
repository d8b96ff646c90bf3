package template

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// TestDebianTemplatesGetPasswordlessSudo checks what a Debian build adds
// for E2B's `sudo` as user: the sudo package and a sudoers rule sudo will
// accept (root-owned, not writable by others).
func TestDebianTemplatesGetPasswordlessSudo(t *testing.T) {
	for _, req := range [][]string{nil, {"python3"}, {"sudo", "git"}} {
		got := debianPackages(req)
		if n := slices.Index(got, "sudo"); n < 0 || slices.Index(got[n+1:], "sudo") >= 0 {
			t.Errorf("debianPackages(%v) = %v, want sudo exactly once", req, got)
		}
		for _, p := range req {
			if !slices.Contains(got, p) {
				t.Errorf("debianPackages(%v) = %v, lost %s", req, got, p)
			}
		}
	}

	rootfs := t.TempDir()
	if err := allowSudo(rootfs); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(rootfs, sudoersFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "user ALL=(ALL:ALL) NOPASSWD: ALL\n"; got != want {
		t.Errorf("got sudoers rule %q, want %q", got, want)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Mode().Perm(); got != 0o440 {
		t.Errorf("got mode %o, want 0440 (sudo skips files others can write)", got)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && os.Geteuid() == 0 && (sys.Uid != 0 || sys.Gid != 0) {
		t.Errorf("got owner %d:%d, want 0:0", sys.Uid, sys.Gid)
	}
	// PAM's account check needs a shadow entry; it must stay unreadable
	// to others. sudo resolves the sandbox's host name.
	shadow := filepath.Join(rootfs, "etc/shadow")
	if b, _ := os.ReadFile(shadow); !strings.Contains(string(b), "\nuser:*:") && !strings.HasPrefix(string(b), "user:*:") {
		t.Errorf("got /etc/shadow %q, want a user entry without a password", b)
	}
	if st, err := os.Stat(shadow); err != nil || st.Mode().Perm()&0o004 != 0 {
		t.Errorf("/etc/shadow: %v, mode %v: want it unreadable to others", err, st.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(rootfs, "etc/hosts")); !strings.Contains(string(b), "127.0.1.1\te2b") {
		t.Errorf("got /etc/hosts %q, want the sandbox host name e2b", b)
	}
	// An existing shadow entry for user is kept.
	again := t.TempDir()
	os.MkdirAll(filepath.Join(again, "etc"), 0o755)
	os.WriteFile(filepath.Join(again, "etc/shadow"), []byte("root:*:1::::::\nuser:!:2::::::\n"), 0o640)
	if err := allowSudo(again); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(again, "etc/shadow")); string(b) != "root:*:1::::::\nuser:!:2::::::\n" {
		t.Errorf("existing /etc/shadow rewritten: %q", b)
	}
	// A rootfs whose sudoers.d leads out of the tree is refused, not followed.
	evil := t.TempDir()
	os.MkdirAll(filepath.Join(evil, "etc"), 0o755)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(evil, "etc/sudoers.d")); err != nil {
		t.Fatal(err)
	}
	if err := allowSudo(evil); err == nil {
		t.Error("allowSudo followed a symlink out of the rootfs")
	}
	if ents, _ := os.ReadDir(outside); len(ents) > 0 {
		t.Errorf("allowSudo wrote %s outside the rootfs", ents[0].Name())
	}
}
