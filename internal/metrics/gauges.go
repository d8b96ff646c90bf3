package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Capacity is a node's size and use, read at each scrape.
type Capacity struct {
	CPUs         int
	MemoryMB     int64
	FreeMemoryMB int64
	MaxSandboxes int
	Sandboxes    int
	Templates    int
	Snapshots    int
}

// NodeInfo is one node as the API server's fleet sees it.
type NodeInfo struct {
	Name            string
	Alive, Cordoned bool
	Sandboxes       int
	FreeMemoryMB    int64
}

// Fleet node states for agentenv_fleet_nodes: every node is in exactly one.
const (
	NodeAlive    = "alive"    // heartbeating and taking sandboxes
	NodeLost     = "lost"     // not heartbeating (cordoned or not)
	NodeCordoned = "cordoned" // heartbeating, taking no new sandboxes
)

// SandboxCount is how many sandboxes of a template are in a lifecycle
// state.
type SandboxCount struct {
	State, Template string
	N               int
}

// Pools is what a host keeps beside its sandboxes, read at each scrape.
type Pools struct {
	// Warm and Hot count, per template, the warm containers waiting for a
	// restore and the booted sandboxes waiting in the hot pool.
	Warm, Hot map[string]int
	// SnapshotBytes is the disk the snapshot store takes.
	SnapshotBytes int64
	// ReapedByTimeout counts the sandboxes killed because their timeout
	// passed, since the host started.
	ReapedByTimeout int64
}

// SetSandboxes sets the function that counts sandboxes by lifecycle state
// and template, exported as agentenv_sandboxes{state,template}. It is
// called at every scrape, so it must be cheap and must not call back into
// the Registry. A pair listed twice is summed. nil removes the series.
func (r *Registry) SetSandboxes(fn func() []SandboxCount) {
	if r == nil {
		return
	}
	store(&r.states, fn)
}

// HideTemplateNames leaves template names (which tenants choose) out of
// the template label of agentenv_sandboxes and agentenv_pool_sandboxes:
// from then on every template's counts are summed under template="".
func (r *Registry) HideTemplateNames() {
	if r == nil {
		return
	}
	r.hideTemplates.Store(true)
}

// SetPools sets the function that reports a host's pools and snapshot
// store, exported as agentenv_pool_sandboxes{pool,template},
// agentenv_snapshot_store_bytes and agentenv_sandboxes_reaped_total. It is
// called at every scrape. nil removes the series.
func (r *Registry) SetPools(fn func() Pools) {
	if r == nil {
		return
	}
	store(&r.pools, fn)
}

// SetCapacity sets the function that reports the node's capacity, exported
// as the agentenv_node_* gauges. It is called at every scrape. nil removes
// the series.
func (r *Registry) SetCapacity(fn func() Capacity) {
	if r == nil {
		return
	}
	store(&r.capacity, fn)
}

// SetNodes sets the function that lists the fleet's nodes (API role),
// exported as agentenv_fleet_nodes{state} and, per node,
// agentenv_fleet_node_sandboxes{node} and
// agentenv_fleet_node_free_memory_bytes{node}. It is called at every
// scrape. nil removes the series.
func (r *Registry) SetNodes(fn func() []NodeInfo) {
	if r == nil {
		return
	}
	store(&r.nodes, fn)
}

const mib = 1 << 20

var (
	sandboxesDesc = prometheus.NewDesc("agentenv_sandboxes",
		"Sandboxes by lifecycle state and template (pooled: waiting in the hot pool).", []string{"state", "template"}, nil)
	poolDesc = prometheus.NewDesc("agentenv_pool_sandboxes",
		"Spares per template: warm containers waiting for a restore (pool=warm), booted sandboxes waiting for a create (pool=hot).", []string{"pool", "template"}, nil)
	snapshotBytesDesc = prometheus.NewDesc("agentenv_snapshot_store_bytes",
		"Disk the snapshot store takes (chunks shared by snapshots counted once).", nil, nil)
	reapedDesc = prometheus.NewDesc("agentenv_sandboxes_reaped_total",
		"Sandboxes killed because their timeout passed.", nil, nil)

	nodeCPUsDesc = prometheus.NewDesc("agentenv_node_cpus",
		"CPUs of the node.", nil, nil)
	nodeMemoryDesc = prometheus.NewDesc("agentenv_node_memory_bytes",
		"Memory of the node.", nil, nil)
	nodeFreeMemoryDesc = prometheus.NewDesc("agentenv_node_free_memory_bytes",
		"Memory of the node still free for sandboxes.", nil, nil)
	nodeMaxSandboxesDesc = prometheus.NewDesc("agentenv_node_max_sandboxes",
		"Most sandboxes the node runs at once.", nil, nil)
	nodeSandboxesDesc = prometheus.NewDesc("agentenv_node_sandboxes",
		"Sandboxes on the node.", nil, nil)
	nodeTemplatesDesc = prometheus.NewDesc("agentenv_node_templates",
		"Templates stored on the node.", nil, nil)
	nodeSnapshotsDesc = prometheus.NewDesc("agentenv_node_snapshots",
		"Snapshots stored on the node.", nil, nil)

	fleetNodesDesc = prometheus.NewDesc("agentenv_fleet_nodes",
		"Nodes of the fleet by state (alive, lost, cordoned).", []string{"state"}, nil)
	fleetNodeSandboxesDesc = prometheus.NewDesc("agentenv_fleet_node_sandboxes",
		"Sandboxes on each node of the fleet.", []string{"node"}, nil)
	fleetNodeFreeMemoryDesc = prometheus.NewDesc("agentenv_fleet_node_free_memory_bytes",
		"Memory still free for sandboxes on each node of the fleet.", []string{"node"}, nil)
)

// callbackCollector reads the Registry's gauge callbacks at scrape time.
type callbackCollector struct{ r *Registry }

func (c *callbackCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		sandboxesDesc, poolDesc, snapshotBytesDesc, reapedDesc,
		nodeCPUsDesc, nodeMemoryDesc, nodeFreeMemoryDesc, nodeMaxSandboxesDesc,
		nodeSandboxesDesc, nodeTemplatesDesc, nodeSnapshotsDesc,
		fleetNodesDesc, fleetNodeSandboxesDesc, fleetNodeFreeMemoryDesc,
	} {
		ch <- d
	}
}

func (c *callbackCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	hide := c.r.hideTemplates.Load()
	template := func(name string) string {
		if hide {
			return ""
		}
		return name
	}
	if fn := load(&c.r.states); fn != nil {
		// Summed first: a pair sent twice (or two templates hidden
		// under one label) would fail the whole gather.
		sum := map[[2]string]int{}
		for _, sc := range fn() {
			sum[[2]string{sc.State, template(sc.Template)}] += sc.N
		}
		for k, n := range sum {
			gauge(sandboxesDesc, float64(n), k[0], k[1])
		}
	}
	if fn := load(&c.r.pools); fn != nil {
		p := fn()
		for _, pool := range []struct {
			name string
			n    map[string]int
		}{{"warm", p.Warm}, {"hot", p.Hot}} {
			sum := map[string]int{}
			for t, n := range pool.n {
				sum[template(t)] += n
			}
			for t, n := range sum {
				gauge(poolDesc, float64(n), pool.name, t)
			}
		}
		gauge(snapshotBytesDesc, float64(p.SnapshotBytes))
		ch <- prometheus.MustNewConstMetric(reapedDesc, prometheus.CounterValue, float64(p.ReapedByTimeout))
	}
	if fn := load(&c.r.capacity); fn != nil {
		cp := fn()
		gauge(nodeCPUsDesc, float64(cp.CPUs))
		gauge(nodeMemoryDesc, float64(cp.MemoryMB*mib))
		gauge(nodeFreeMemoryDesc, float64(cp.FreeMemoryMB*mib))
		gauge(nodeMaxSandboxesDesc, float64(cp.MaxSandboxes))
		gauge(nodeSandboxesDesc, float64(cp.Sandboxes))
		gauge(nodeTemplatesDesc, float64(cp.Templates))
		gauge(nodeSnapshotsDesc, float64(cp.Snapshots))
	}
	if fn := load(&c.r.nodes); fn != nil {
		c.collectNodes(fn(), gauge)
	}
}

func (c *callbackCollector) collectNodes(nodes []NodeInfo, gauge func(*prometheus.Desc, float64, ...string)) {
	byState := map[string]int{NodeAlive: 0, NodeLost: 0, NodeCordoned: 0}
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		switch {
		case !n.Alive:
			byState[NodeLost]++
		case n.Cordoned:
			byState[NodeCordoned]++
		default:
			byState[NodeAlive]++
		}
		// A name listed twice would fail the whole gather; keep the first.
		if seen[n.Name] {
			continue
		}
		seen[n.Name] = true
		gauge(fleetNodeSandboxesDesc, float64(n.Sandboxes), n.Name)
		gauge(fleetNodeFreeMemoryDesc, float64(n.FreeMemoryMB*mib), n.Name)
	}
	for state, n := range byState {
		gauge(fleetNodesDesc, float64(n), state)
	}
}
