package imagebuild

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// cacheDirs are the build cache's directories; every base, layer and
// tree lives in one of them.
var cacheDirs = []string{"bases", "layers", "tmp", "scratch", "trees"}

// makePrivate makes the build cache dir and its directories root's alone
// (owned by this process's user, mode 0700), whatever they were before:
// an operator's chmod -R or a volume's group ownership may have opened
// them. The trees in them keep the uids and setuid bits the build's
// sandboxes gave them (later RUN steps, whose gVisor sees the host's
// owners and modes, need them, and so does the template's image), so no
// other host user may reach them: a setuid-root file in a layer must not
// run on the host, nor a layer's file count as a host user's.
func makePrivate(dir string) error {
	uid, gid := os.Geteuid(), os.Getegid()
	for _, d := range append([]string{"."}, cacheDirs...) {
		p := filepath.Join(dir, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			return err
		}
		// The cache dir itself may be a link the operator made; what is
		// in it may not.
		stat := os.Lstat
		if d == "." {
			stat = os.Stat
		}
		fi, err := stat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("build cache %s is not a directory (a link?): remove it", p)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != uid || int(st.Gid) != gid) {
			if err := os.Chown(p, uid, gid); err != nil {
				return fmt.Errorf("build cache %s: owned by %d:%d, and it must be this server's alone: %w", p, st.Uid, st.Gid, err)
			}
		}
		if fi.Mode().Perm() != 0o700 || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky) != 0 {
			if err := os.Chmod(p, 0o700); err != nil {
				return fmt.Errorf("build cache %s: %w", p, err)
			}
		}
	}
	return nil
}
