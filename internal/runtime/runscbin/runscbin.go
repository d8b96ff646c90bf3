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
)

// Features are what a runsc build can do beyond upstream's, from the
// patches in patches/gvisor; its `--version` names them on a line
// "agentenv: NAME ...". A runsc without that line has none.
type Features struct {
	// GoferlessFilestore: the sandbox process creates the root overlay's
	// self filestore itself (patch 0002), so a write layer on disk needs
	// no gofer process.
	GoferlessFilestore bool `json:"goferless_filestore,omitempty"`
	// RootfsLowerImages: the root overlay stacks EROFS images below the
	// rootfs image (patch 0008, ocispec.LowersAnnotation).
	RootfsLowerImages bool `json:"rootfs_lower_images,omitempty"`
}

// Version returns the build name of the runsc binary at path (its
// `--version` line and a digest of the binary: a `go install` build
// reports no version of its own) and the features its patches add.
func Version(path string) (string, Features, error) {
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "", Features{}, fmt.Errorf("%s --version: %w", path, err)
	}
	lines := strings.Split(string(out), "\n")
	var feat Features
	for _, l := range lines[1:] {
		if names, ok := strings.CutPrefix(strings.TrimSpace(l), "agentenv:"); ok {
			for _, n := range strings.Fields(names) {
				switch n {
				case "goferless-self-filestore":
					feat.GoferlessFilestore = true
				case "rootfs-lower-images":
					feat.RootfsLowerImages = true
				}
			}
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return "", Features{}, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", Features{}, err
	}
	return strings.TrimSpace(lines[0]) + " (sha256 " + hex.EncodeToString(h.Sum(nil))[:16] + ")", feat, nil
}

// SharedRoot is runsc's --shared-root for every sandbox on the host. runsc
// keeps one thing there: an empty network namespace bind-mounted at
// null-netns, which every gofer process joins (pinned by the first). Under
// --root it would stay mounted in the data directory after the server
// stops; in /run it is one mount per host, gone at reboot.
const SharedRoot = "/run/agentenv/runsc-shared"

// MkSharedRoot creates SharedRoot.
func MkSharedRoot() error { return os.MkdirAll(SharedRoot, 0o700) }
