package gvisorgo

import (
	"debug/buildinfo"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	glog "gvisor.dev/gvisor/pkg/log"
	"gvisor.dev/gvisor/runsc/specutils"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// Process-wide settings of gVisor's packages. They are globals in gVisor, so
// every Gvisor in one process must agree on them.
var (
	setupMu  sync.Mutex
	exePath  string // the runsc binary specutils.ExePath points at
	logSetUp bool
)

// setupProcess points gVisor's packages at the runsc binary and moves their
// logging off the process's stderr (gVisor logs there by default, at Info).
func setupProcess(runsc string) error {
	setupMu.Lock()
	defer setupMu.Unlock()
	switch exePath {
	case runsc:
	case "":
		exePath = runsc
		specutils.ExePath = runsc
	default:
		return fmt.Errorf("gvisorgo: runsc is already %s in this process, cannot also use %s: %w", exePath, runsc, errdefs.ErrConflict)
	}
	if !logSetUp {
		logSetUp = true
		glog.SetLevel(glog.Warning)
		glog.SetTarget(glog.GoogleEmitter{Writer: &glog.Writer{Next: slogWriter{}}})
	}
	return nil
}

// slogWriter forwards gVisor's warnings to the default slog logger at debug
// level: gVisor warns about things that are expected here (no sidecar
// binaries, cgroup v1 joins), and real failures come back as errors.
type slogWriter struct{}

func (slogWriter) Write(p []byte) (int, error) {
	msg := string(p)
	if n := len(msg); n > 0 && msg[n-1] == '\n' {
		msg = msg[:n-1]
	}
	slog.Debug("gvisor", "log", msg)
	return len(p), nil
}

var _ io.Writer = slogWriter{}

// readBuildModule returns the version of module mod that the Go binary at
// path was built with (as its main module or a dependency).
func readBuildModule(path, mod string) (string, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", err
	}
	if bi.Main.Path == mod {
		return bi.Main.Version, nil
	}
	for _, d := range bi.Deps {
		if d.Path == mod {
			if d.Replace != nil {
				return d.Replace.Version, nil
			}
			return d.Version, nil
		}
	}
	return "", fmt.Errorf("%s is not built from %s", path, mod)
}

// devNull is opened once and handed to every sandbox as its stdin.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })
