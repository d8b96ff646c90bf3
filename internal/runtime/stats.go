package runtime

import (
	"context"
	"time"
)

// Stats is one sample of a sandbox's resource use, as its host sees it.
type Stats struct {
	// CPU is the CPU time the sandbox has used since it was created.
	CPU time.Duration
	// MemUsed is the memory charged to the sandbox that the host cannot
	// simply drop (page cache it could reclaim at once is left out).
	MemUsed int64
	// MemLimit is the sandbox's memory cap; 0 when it has none.
	MemLimit int64
	// MemCache is file page cache charged to the sandbox.
	MemCache int64
	// OOMKills counts the processes the host's OOM killer killed in the
	// sandbox's memory cgroup: past 0, a sandbox that died ran out of its
	// memory limit.
	OOMKills int64
}

// Statser is implemented by runtimes that can report a sandbox's resource
// use. Stats of an unknown sandbox is an error wrapping errdefs.ErrNotFound;
// a runtime that runs sandboxes without resource accounting (no cgroups)
// answers errdefs.ErrUnavailable.
type Statser interface {
	Stats(ctx context.Context, id string) (Stats, error)
}
