// Package runtime defines the seam between agentenv and an isolation runtime
// (gVisor today, Firecracker later). It owns the contract only; it must not
// know about templates, networking policy or the API.
package runtime

import (
	"context"
	"time"
)

// Spec describes one sandbox to a runtime. Paths are on the host.
type Spec struct {
	// ID is the runtime's container ID. Runtimes may match IDs by prefix,
	// so callers use fixed-width IDs.
	ID string
	// Dir is a private, empty-at-first directory the runtime may use for
	// its bundle, logs and sockets. The caller removes it after Destroy.
	Dir string
	// Image is the read-only root filesystem image (EROFS) shared by every
	// sandbox of a template. Writes go to a per-sandbox write layer.
	Image string
	// Lowers are read-only EROFS images stacked below Image, top first
	// (a layered template: Image is its top layer). A file in a higher
	// layer hides the same path below. Only a runtime that is a
	// LayerStacker saying yes takes them; others refuse the spec.
	Lowers []string
	// DiskMB is the size of the write layer, kept in a sparse file on the
	// host's disk under Dir (see ocispec.FilestorePath); writing past it
	// fails with ENOSPC inside the sandbox. Zero keeps the writes in
	// memory (sandboxes and snapshots made before the disk layer).
	DiskMB int64
	// Args, Env and Cwd describe the init process (envd).
	Args []string
	Env  []string
	Cwd  string
	// NetNS is the path of the network namespace the sandbox joins; empty
	// means no network at all.
	NetNS string
	// Binds are host directories mounted read-write into the sandbox
	// (volumes), in order.
	Binds []Bind
	// Resource limits. Zero means the runtime's default.
	CPUs     float64
	MemoryMB int64
	Pids     int64
	Hostname string
}

// Bind mounts host directory Source at Destination inside a sandbox,
// read-write, sharing its contents with the host and with every other
// sandbox that binds it.
type Bind struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// Status is what a runtime reports about one sandbox.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
	// StatusUnknown means the runtime has no such sandbox.
	StatusUnknown Status = "unknown"
)

// Runtime creates and destroys isolated sandboxes.
//
// Contract:
//   - Create starts the sandbox's init process and returns once it runs. On
//     error nothing of the sandbox is left behind (processes, mounts,
//     cgroups, state files).
//   - State reports StatusUnknown, not an error, for an ID it does not know.
//   - Destroy stops and removes the sandbox; destroying an unknown or
//     already destroyed sandbox succeeds (idempotent).
//   - List returns the IDs of every sandbox the runtime holds, including
//     ones left by an earlier process that crashed, so callers can adopt
//     or remove them.
type Runtime interface {
	Create(ctx context.Context, spec Spec) error
	State(ctx context.Context, id string) (Status, error)
	Destroy(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
	// Version names the runtime build (recorded in snapshots).
	Version() string
}

// Pauser is implemented by runtimes that can freeze a sandbox in place.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Checkpointer is implemented by runtimes that can save a running sandbox
// and start new sandboxes from the saved state.
//
// Contract:
//   - Checkpoint writes the sandbox's memory, processes and writable
//     filesystem layer into dir (created if missing) and leaves the sandbox
//     running as it was.
//   - Restore starts a new sandbox, described by spec (same image and init
//     process as the checkpointed one; its own ID, directory and network),
//     from dir. Its
//     processes continue where the checkpointed ones were. On error nothing
//     of the new sandbox is left behind. dir is not modified and may be
//     restored any number of times. The sandbox may go on reading the
//     checkpoint's memory after Restore returns, through descriptors of its
//     own: dir may be removed then, but its files must not be rewritten.
type Checkpointer interface {
	Checkpoint(ctx context.Context, id, dir string) error
	Restore(ctx context.Context, spec Spec, dir string) error
}

// LayerStacker is implemented by runtimes that may stack read-only images
// (Spec.Lowers).
//
// Contract: StacksLayers reports whether this runtime's Create, Prepare
// and Restore take a spec with Lowers; when it says no they refuse one
// (ErrInvalid). A sandbox on a stack sees every layer (the highest copy of
// a path), writes only to its own write layer, and a checkpoint of it
// restores onto the same stack.
type LayerStacker interface {
	StacksLayers() bool
}

// Preparer is implemented by runtimes that can create a sandbox ahead of
// time, without starting it, for a later Restore with the same spec ID to
// restore into (saving the sandbox's start-up on the restore path).
type Preparer interface {
	Prepare(ctx context.Context, spec Spec) error
}

// Watcher is implemented by runtimes that can report a sandbox's exit
// (crash, out of memory, init process gone) without polling.
type Watcher interface {
	// Exited returns a channel closed when the sandbox's processes have
	// exited. It fails if the sandbox is not running.
	Exited(ctx context.Context, id string) (<-chan struct{}, error)
}

// Execer runs a process inside a sandbox without going through envd. It is
// used by benchmarks and diagnostics, not by the API path. out is the last
// ExecOutputMax bytes of the process's output at most: a sandbox printing
// without end cannot grow the host's memory.
type Execer interface {
	Exec(ctx context.Context, id string, args []string) (exitCode int, out []byte, err error)
}

// ExecOutputMax is the most of an Exec's output a runtime keeps.
const ExecOutputMax = 64 << 10

// Tail is a writer that keeps the last max bytes written to it (a
// runtime's Exec output), in at most twice that memory.
type Tail struct {
	max int
	b   []byte
}

// NewTail returns a Tail of max bytes.
func NewTail(max int) *Tail { return &Tail{max: max} }

func (t *Tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) > t.max {
		p = p[len(p)-t.max:]
	}
	if len(t.b)+len(p) > 2*t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-(t.max-len(p)):]...)
	}
	t.b = append(t.b, p...)
	return n, nil
}

// Bytes returns the last max bytes written.
func (t *Tail) Bytes() []byte {
	if len(t.b) > t.max {
		return t.b[len(t.b)-t.max:]
	}
	return t.b
}

// Timings collects how long a runtime step took, for benchmarks.
type Timings map[string]time.Duration
