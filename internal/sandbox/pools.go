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

// Pools counts the warm and hot pools. It takes the pools' locks only,
// never the manager's or a sandbox's, so a scrape does not wait for a
// lifecycle operation.
func (m *Manager) Pools() PoolCounts {
	return PoolCounts{Warm: m.warm.Counts(), Hot: m.hot.Counts(), ReapedByTimeout: m.reaped.Load()}
}
