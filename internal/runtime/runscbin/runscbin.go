// Package runscbin names a runsc build. A checkpoint restores only with the
// build that wrote it, so both gVisor drivers record this name in every
// snapshot and compare it before a restore. It must not run sandboxes.
package runscbin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"agentenv/internal/childproc"
)

// Version returns the build name of the runsc binary at path: its
// `--version` line and a digest of the binary (a `go install` build
// reports no version of its own).
func Version(path string) (string, error) {
	out, err := childproc.Output(exec.Command(path, "--version"))
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	line := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return line + " (sha256 " + hex.EncodeToString(h.Sum(nil))[:16] + ")", nil
}

// SharedRoot is runsc's --shared-root for every sandbox on the host. runsc
// keeps one thing there: an empty network namespace bind-mounted at
// null-netns, which every gofer process joins (pinned by the first). Under
// --root it would stay mounted in the data directory after the server
// stops; in /run it is one mount per host, gone at reboot.
const SharedRoot = "/run/agentenv/runsc-shared"

// MkSharedRoot creates SharedRoot.
func MkSharedRoot() error { return os.MkdirAll(SharedRoot, 0o700) }
