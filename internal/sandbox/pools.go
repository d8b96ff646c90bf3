package sandbox

// PoolCounts is what a manager keeps beside its sandboxes, for /metrics.
type PoolCounts struct {
	// Warm and Hot count, per template, the warm containers and the hot
	// pool's sandboxes waiting to be handed out.
	Warm, Hot map[string]int
	// ReapedByTimeout counts the sandboxes killed because their timeout
	// passed, since the manager started.
	ReapedByTimeout int64
}

// Pools counts the warm and hot pools. It takes the manager's lock only,
// never a sandbox's, so a scrape does not wait for a lifecycle operation.
func (m *Manager) Pools() PoolCounts {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := PoolCounts{Warm: make(map[string]int, len(m.warm)), Hot: make(map[string]int, len(m.hot)), ReapedByTimeout: m.reaped.Load()}
	for t, ws := range m.warm {
		out.Warm[t] = len(ws)
	}
	for t, ids := range m.hot {
		out.Hot[t] = len(ids)
	}
	return out
}
