package gvisorgo

import (
	"context"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/cgroupstat"
)

var _ runtime.Statser = (*Gvisor)(nil)

// Stats implements runtime.Statser from the sandbox's cgroups.
func (g *Gvisor) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if err := validID(id); err != nil {
		return runtime.Stats{}, err
	}
	if !g.Cgroups {
		return runtime.Stats{}, errdefs.Unavailable("sandbox metrics come from cgroups, and this server runs sandboxes without them (--no-cgroups)")
	}
	return cgroupstat.Read(cgroupstat.Root, g.cgroupPath(id))
}
