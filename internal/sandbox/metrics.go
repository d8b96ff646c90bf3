package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// Metric is one sample of a sandbox's resource use (E2B's SandboxMetric).
type Metric struct {
	Timestamp time.Time `json:"timestamp"`
	CPUCount  int       `json:"cpuCount"`
	// CPUUsedPct is the share of the sandbox's CPUs it used, 0–100, since
	// the previous sample (or since it started, for the first).
	CPUUsedPct float64 `json:"cpuUsedPct"`
	MemUsed    int64   `json:"memUsed"`
	MemTotal   int64   `json:"memTotal"`
	MemCache   int64   `json:"memCache"`
	// DiskUsed and DiskTotal describe the sandbox's root filesystem: the
	// template image plus the write layer (see diskUse).
	DiskUsed  int64 `json:"diskUsed"`
	DiskTotal int64 `json:"diskTotal"`
}

// cpuSample is the CPU time a sandbox had used at a moment.
type cpuSample struct {
	at  time.Time
	cpu time.Duration
	pct float64 // what the previous interval gave
}

// minCPUInterval is the shortest interval a CPU share is computed over;
// samples closer together repeat the previous share.
const minCPUInterval = 200 * time.Millisecond

// cpuSamples holds a manager's last sample of each sandbox, so that a
// sample's CPU share covers the time since the one before; gone sandboxes
// are pruned when the map outgrows the live ones.
type cpuSamples struct {
	sync.Mutex
	m map[string]cpuSample
}

// Metrics samples sandbox id's resource use now. A sandbox with no
// processes (paused without memory) gives a zero Metric (no Timestamp).
func (m *Manager) Metrics(ctx context.Context, id string) (Metric, error) {
	sb, err := m.Get(id)
	if err != nil {
		return Metric{}, err
	}
	st, ok := m.d.Runtime.(runtime.Statser)
	if !ok {
		return Metric{}, errdefs.Unavailable("the %s runtime does not report resource use", m.d.Runtime.Version())
	}
	s, err := st.Stats(ctx, id)
	if err != nil && sb.State != StateRunning && errors.Is(err, errdefs.ErrNotFound) {
		// Paused without its memory (or between lifecycle steps): nothing
		// runs, so there is nothing to sample.
		return Metric{}, nil
	}
	if err != nil {
		return Metric{}, fmt.Errorf("metrics of sandbox %s: %w", id, err)
	}
	now := time.Now()
	out := Metric{Timestamp: now.UTC(), CPUCount: max(sb.CPUs, 1), MemUsed: s.MemUsed, MemCache: s.MemCache}
	out.MemTotal = int64(sb.MemoryMB) << 20
	if out.MemTotal == 0 || (s.MemLimit > 0 && s.MemLimit < out.MemTotal) {
		out.MemTotal = s.MemLimit
	}
	out.CPUUsedPct = m.cpu.share(&m.reg, sb, s.CPU, now)
	out.DiskUsed, out.DiskTotal = m.diskUse(sb, out.MemTotal)
	return out, nil
}

// share is the share of its CPUs sb used since its previous sample;
// samples of sandboxes reg no longer lists are pruned.
func (c *cpuSamples) share(reg *registry, sb Sandbox, cpu time.Duration, now time.Time) float64 {
	c.Lock()
	defer c.Unlock()
	if c.m == nil {
		c.m = map[string]cpuSample{}
	}
	mine := c.m
	prev, ok := mine[sb.ID]
	if !ok {
		prev = cpuSample{at: sb.StartedAt}
	}
	if ok && now.Sub(prev.at) < minCPUInterval {
		return prev.pct
	}
	pct := 0.0
	if wall := now.Sub(prev.at); wall > 0 && cpu >= prev.cpu {
		pct = 100 * float64(cpu-prev.cpu) / float64(wall) / float64(max(sb.CPUs, 1))
	}
	pct = min(max(pct, 0), 100)
	mine[sb.ID] = cpuSample{at: now, cpu: cpu, pct: pct}
	if live, _ := reg.count(); len(mine) > 2*live+64 { // amortized: not a scan per call
		for id := range mine {
			if !reg.listed(id) {
				delete(mine, id)
			}
		}
	}
	return pct
}

// diskUse is the sandbox's root filesystem: its template's image plus
// its write layer, on disk (a sparse file of DiskMB: what it holds now) or
// else in memory (its bytes count in memUsed; room: the memory limit).
func (m *Manager) diskUse(sb Sandbox, memTotal int64) (used, total int64) {
	var image int64
	if t, err := m.d.Templates.Get(sb.Template); err == nil {
		image = t.ImageSize
	}
	if sb.DiskMB > 0 {
		return image + m.LayerBytes(sb.ID), image + int64(sb.DiskMB)<<20
	}
	return image, image + memTotal
}
