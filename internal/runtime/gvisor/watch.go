package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/agentenv/agentenv/internal/runtime/pidfd"

	"github.com/agentenv/agentenv/internal/runtime"
)

var _ runtime.Watcher = (*Gvisor)(nil)

// Exited implements runtime.Watcher with a pidfd of the sandbox process,
// waited on by Go's network poller (no thread blocked per sandbox).
func (g *Gvisor) Exited(ctx context.Context, id string) (<-chan struct{}, error) {
	out, err := g.run(ctx, "state", id)
	if err != nil {
		return nil, err
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("runsc state %s: %w", id, err)
	}
	if st.Pid <= 0 {
		return nil, fmt.Errorf("sandbox %s has no process (status %s)", id, st.Status)
	}
	done, err := pidfd.Watch(st.Pid, false)
	if err != nil {
		return nil, fmt.Errorf("watch sandbox %s: %w", id, err)
	}
	return done, nil
}
