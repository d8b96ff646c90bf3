// Package store is the fleet's state in etcd: the key layout, the records
// each key holds (each its own type, sealed with the cluster secret),
// tombstones, and the API server's watch cache of all of it. It knows
// nothing of how nodes are called or sandboxes run.
package store

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/volume"
)

// The etcd layout. Node, template and snapshot keys live under their
// node's lease (they vanish with it); sandbox records do not (a lost node's
// sandboxes are reported lost, not forgotten).
const (
	prefix         = "/agentenv/"
	NodesPrefix    = prefix + "nodes/"     // nodes/<node> → NodeRecord
	CordonPrefix   = prefix + "cordon/"    // cordon/<node> → "cordon" | "drain"
	SandboxPrefix  = prefix + "sandboxes/" // sandboxes/<id> → SandboxRecord
	LostPrefix     = prefix + "lost/"      // lost/<id> → Tombstone
	TemplatePrefix = prefix + "templates/" // templates/<name>/<node> → service.TemplateInfo
	SnapPrefix     = prefix + "snapshots/" // snapshots/<id>/<node> → SnapshotEntry
	// Volume records are not under a lease either: a lost node's volumes
	// answer 503 naming it, and come back with it.
	VolumePrefix     = prefix + "volumes/"      // volumes/<id> → VolumeRecord
	VolumeNamePrefix = prefix + "volume-names/" // volume-names/<owner>/<name> → the volume's ID
)

// VolumeRecord says which node holds a volume. Its node writes it, in
// the same transaction as the volume's name key (VolumeNameKey), so
// that names are unique per owner across the fleet.
type VolumeRecord struct {
	ID      string    `json:"id"`
	Name    string    `json:"name"`
	Owner   string    `json:"owner,omitempty"`
	Node    string    `json:"node"`
	Created time.Time `json:"created"`
}

// VolumeNameKey is the key that reserves owner's volume name.
func VolumeNameKey(owner, name string) string {
	return VolumeNamePrefix + url.PathEscape(owner) + "/" + name
}

// Capacity is what a node can hold and holds now.
type Capacity struct {
	CPUs         int   `json:"cpus"`
	MemoryMB     int64 `json:"memoryMB"`
	FreeMemoryMB int64 `json:"freeMemoryMB"`
	MaxSandboxes int   `json:"maxSandboxes"`
	Sandboxes    int   `json:"sandboxes"`
	Templates    int   `json:"templates"`
	Snapshots    int   `json:"snapshots"`
}

// NodeRecord is a live node as it registers itself.
type NodeRecord struct {
	Name string `json:"name"`
	Addr string `json:"addr"` // host:port of its RPC and proxy
	// TLS: the node serves HTTPS (verify it with the fleet's CA).
	TLS       bool      `json:"tls,omitempty"`
	Runtime   string    `json:"runtime"`
	StartedAt time.Time `json:"startedAt"`
	Capacity  Capacity  `json:"capacity"`
}

// baseURL is the URL prefix of the node. With needTLS (the caller was
// given the fleet's CA) a node that registered without TLS is refused:
// whether TLS is used never depends on what a record says.
func (n NodeRecord) BaseURL(needTLS bool) (string, error) {
	if n.TLS {
		return "https://" + n.Addr, nil
	}
	if needTLS {
		return "", errdefs.Unavailable("node %s (%s) registered without TLS, but this fleet requires it (--tls-ca): start the node with --tls-cert, --tls-key and --tls-ca", n.Name, n.Addr)
	}
	return "http://" + n.Addr, nil
}

// SandboxRecord says which node runs a sandbox, with its last state.
type SandboxRecord struct {
	Node    string       `json:"node"`
	Sandbox SandboxEntry `json:"sandbox"`
}

// SandboxEntry is a sandbox as etcd records it: what API servers list,
// filter and place by. Its tokens, env vars and network slot stay on its
// node: API servers answer them from the node's own answer (create, get,
// connect), never from etcd. The JSON names are sandbox.Sandbox's, so
// records written before this type still read.
type SandboxEntry struct {
	ID        string            `json:"sandboxID"`
	Template  string            `json:"templateID"`
	State     sandbox.State     `json:"state"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CPUs      int               `json:"cpuCount"`
	MemoryMB  int               `json:"memoryMB"`
	DiskMB    int               `json:"diskMB,omitempty"`
	StartedAt time.Time         `json:"startedAt"`
	EndAt     time.Time         `json:"endAt"`
	Snapshot  string            `json:"snapshotID,omitempty"`
	Parent    string            `json:"parentSandboxID,omitempty"`
	Network   sandbox.Network   `json:"network"`
	Reason    string            `json:"reason,omitempty"`
	Lifecycle sandbox.Lifecycle `json:"lifecycle,omitempty"`
	// FilesOnly is read from records written before the paused-files
	// state (paused + filesOnly); new records carry the state alone.
	FilesOnly bool   `json:"filesOnly,omitempty"`
	Owner     string `json:"owner,omitempty"`
	// Volumes are the volumes it mounts (their host directories left
	// out): they pin it, and its fork children, to their node.
	Volumes []volume.Mount `json:"volumes,omitempty"`
}

// recordOf is the etcd record of sandbox sb on node.
func RecordOf(node string, sb sandbox.Sandbox) SandboxRecord {
	return SandboxRecord{Node: node, Sandbox: SandboxEntry{
		ID: sb.ID, Template: sb.Template, State: sb.State, Metadata: sb.Metadata, CPUs: sb.CPUs, MemoryMB: sb.MemoryMB,
		DiskMB: sb.DiskMB, StartedAt: sb.StartedAt, EndAt: sb.EndAt, Snapshot: sb.Snapshot, Parent: sb.Parent,
		Network: sb.Network, Reason: sb.Reason, Lifecycle: sb.Lifecycle, Owner: sb.Owner, Volumes: mountRefs(sb.Volumes),
	}}
}

func mountRefs(ms []volume.Mount) []volume.Mount {
	var out []volume.Mount
	for _, m := range ms {
		out = append(out, volume.Mount{ID: m.ID, Name: m.Name, Path: m.Path})
	}
	return out
}

// sandbox is the entry as a sandbox (without what etcd does not hold).
func (e SandboxEntry) sandbox() sandbox.Sandbox {
	state := e.State
	if e.FilesOnly && state == sandbox.StatePaused {
		state = sandbox.StatePausedFiles
	}
	return sandbox.Sandbox{
		ID: e.ID, Template: e.Template, State: state, Metadata: e.Metadata, CPUs: e.CPUs, MemoryMB: e.MemoryMB,
		DiskMB: e.DiskMB, StartedAt: e.StartedAt, EndAt: e.EndAt, Snapshot: e.Snapshot, Parent: e.Parent,
		Network: e.Network, Reason: e.Reason, Lifecycle: e.Lifecycle, Owner: e.Owner, Volumes: e.Volumes,
	}
}

// SnapshotEntry is a snapshot as etcd records it under each node holding
// it: what API servers list and show. Its file layout (a peer asks the
// holder for it when it copies), access token and env vars stay on the
// node. The JSON names are snapshot.Snapshot's, so older records read.
type SnapshotEntry struct {
	ID        string            `json:"snapshotID"`
	Name      string            `json:"name,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Template  string            `json:"templateID"`
	Parent    string            `json:"parentSnapshotID,omitempty"`
	Sandbox   string            `json:"sandboxID"`
	Runtime   string            `json:"runtimeVersion"`
	Size      int64             `json:"sizeBytes"`
	CreatedAt time.Time         `json:"createdAt"`
	Internal  bool              `json:"internal,omitempty"`
	Owner     string            `json:"owner,omitempty"`
	CPUs      int               `json:"cpuCount"`
	MemoryMB  int               `json:"memoryMB"`
	Nproc     int64             `json:"nproc,omitempty"`
	DiskMB    int               `json:"diskMB,omitempty"`
	Stored    int64             `json:"storedBytes"`
	// Volumes are the volumes its restore mounts again (their host
	// directories left out): it restores on their node only.
	Volumes []volume.Mount `json:"volumes,omitempty"`
}

// SnapshotOf is the etcd record of snapshot sn.
func SnapshotOf(sn snapshot.Snapshot) SnapshotEntry {
	return SnapshotEntry{ID: sn.ID, Name: sn.Name, Metadata: sn.Metadata, Template: sn.Template, Parent: sn.Parent, Sandbox: sn.Sandbox,
		Runtime: sn.Runtime, Size: sn.Size, CreatedAt: sn.CreatedAt, Internal: sn.Internal, Owner: sn.Owner, CPUs: sn.CPUs,
		MemoryMB: sn.MemoryMB, Nproc: sn.Nproc, DiskMB: sn.DiskMB, Stored: sn.Stored, Volumes: mountRefs(sn.Volumes)}
}

// Snapshot is the entry as a snapshot (without what etcd does not hold).
func (e SnapshotEntry) Snapshot() snapshot.Snapshot {
	return snapshot.Snapshot{ID: e.ID, Name: e.Name, Metadata: e.Metadata, Template: e.Template, Parent: e.Parent, Sandbox: e.Sandbox,
		Runtime: e.Runtime, Size: e.Size, CreatedAt: e.CreatedAt, Internal: e.Internal, Owner: e.Owner, CPUs: e.CPUs,
		MemoryMB: e.MemoryMB, Nproc: e.Nproc, DiskMB: e.DiskMB, Stored: e.Stored, Volumes: e.Volumes}
}

// CordonMark is a cordon/<node> record: the node it is for (so that a
// sealed mark cannot be moved to another key) and "cordon" or "drain".
type CordonMark struct {
	Node string `json:"node"`
	Mode string `json:"mode"`
}

// Tombstone explains why a sandbox is gone when its node could not.
type Tombstone struct {
	ID     string    `json:"id"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// NodeView is a node as an API server sees it.
type NodeView struct {
	NodeRecord
	Alive     bool      `json:"alive"`
	Cordoned  bool      `json:"cordoned"`
	Draining  bool      `json:"draining"`
	LostAt    time.Time `json:"lostAt,omitzero"`
	Sandboxes int       `json:"sandboxes"`
}

// Cache is an API server's copy of the fleet's state, kept by one etcd
// watch (no polling). Reads never wait on etcd.
type Cache struct {
	cli  *clientv3.Client
	seal *secret.Sealer
	log  *slog.Logger
	// refused counts records that did not open with the cluster secret.
	refused atomic.Int64

	mu        sync.RWMutex
	nodes     map[string]NodeRecord
	known     map[string]NodeRecord // every node seen, alive or not
	lostAt    map[string]time.Time
	cordon    map[string]string
	cordonRev map[string]int64 // revision of each node's last cordon change seen
	sandboxes map[string]SandboxRecord
	perNode   map[string]int
	templates map[string]map[string]service.TemplateInfo // name → node → info
	snaps     map[string]map[string]snapshot.Snapshot    // id → node → snapshot
	volumes   map[string]VolumeRecord                    // id → record
	// gone holds, per live node, a channel closed when it is lost: calls
	// in flight to it end then instead of waiting on a dead link.
	gone map[string]chan struct{}
	// deleted remembers, for a minute, the sandboxes whose records the
	// watch saw deleted: an answer that arrives after the delete (a fork
	// child killed at once through another API server) must not bring
	// its record back.
	deleted map[string]time.Time
	ready   chan struct{}
}

// NewCache starts watching the fleet's state; Wait blocks until the first
// full read is in.
func NewCache(ctx context.Context, cli *clientv3.Client, seal *secret.Sealer, log *slog.Logger) *Cache {
	c := &Cache{cli: cli, seal: seal, log: log, ready: make(chan struct{}), gone: map[string]chan struct{}{}, deleted: map[string]time.Time{}}
	c.reset()
	go c.run(ctx)
	return c
}

func (c *Cache) reset() {
	c.nodes = map[string]NodeRecord{}
	if c.known == nil {
		c.known = map[string]NodeRecord{}
		c.lostAt = map[string]time.Time{}
	}
	c.cordon = map[string]string{}
	c.cordonRev = map[string]int64{}
	c.sandboxes = map[string]SandboxRecord{}
	c.perNode = map[string]int{}
	c.templates = map[string]map[string]service.TemplateInfo{}
	c.snaps = map[string]map[string]snapshot.Snapshot{}
	c.volumes = map[string]VolumeRecord{}
}

// Wait blocks until the cache holds a full read of the fleet.
func (c *Cache) Wait(ctx context.Context) error {
	select {
	case <-c.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reading the fleet's state from etcd: %w", ctx.Err())
	}
}

// run reads everything once, then follows changes; after a compaction or
// a broken watch it reads everything again.
func (c *Cache) run(ctx context.Context) {
	once := sync.Once{}
	for ctx.Err() == nil {
		resp, err := c.cli.Get(ctx, prefix, clientv3.WithPrefix())
		if err != nil {
			c.log.Warn("fleet: reading state from etcd", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		c.load(resp.Kvs)
		once.Do(func() { close(c.ready) })
		wch := c.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				c.log.Warn("fleet: watch ended; reading state again", "err", err)
				break
			}
			c.mu.Lock()
			for _, ev := range wr.Events {
				c.apply(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete, ev.Kv.ModRevision)
			}
			c.mu.Unlock()
		}
	}
}

// load replaces the whole state with a full read. The values are decoded
// before the lock is taken: at 200,000 records that takes seconds, which
// creates and lists must not wait for.
func (c *Cache) load(kvs []*mvccpb.KeyValue) {
	next := &Cache{seal: c.seal, log: c.log, known: map[string]NodeRecord{}, lostAt: map[string]time.Time{}}
	next.reset()
	for _, kv := range kvs {
		next.apply(string(kv.Key), kv.Value, false, kv.ModRevision)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name := range c.nodes {
		if _, ok := next.nodes[name]; !ok {
			c.lostAt[name] = time.Now()
			c.markGone(name)
		}
	}
	for name, n := range next.nodes {
		c.known[name] = n
		delete(c.lostAt, name)
	}
	c.nodes, c.cordon, c.cordonRev, c.sandboxes, c.perNode = next.nodes, next.cordon, next.cordonRev, next.sandboxes, next.perNode
	c.templates, c.snaps, c.volumes = next.templates, next.snaps, next.volumes
	c.refused.Add(next.refused.Load())
	c.log.Info("fleet: state read from etcd", "nodes", len(c.nodes), "sandboxes", len(c.sandboxes))
}

// apply records one key's new value (or its deletion) made at revision
// rev. Callers hold c.mu.
func (c *Cache) apply(key string, val []byte, deleted bool, rev int64) {
	switch {
	case strings.HasPrefix(key, NodesPrefix):
		name := strings.TrimPrefix(key, NodesPrefix)
		if deleted {
			if _, ok := c.nodes[name]; ok {
				c.lostAt[name] = time.Now()
				c.log.Warn("fleet: node lost (its lease expired or it stopped)", "node", name)
			}
			delete(c.nodes, name)
			c.markGone(name)
			return
		}
		n, ok := openRecord(c, key, val, func(n NodeRecord) bool { return n.Name == name && n.Addr != "" })
		if !ok {
			return
		}
		if _, ok := c.nodes[name]; !ok {
			c.log.Info("fleet: node up", "node", name, "addr", n.Addr)
		}
		c.nodes[name] = n
		c.known[name] = n
		delete(c.lostAt, name)
	case strings.HasPrefix(key, CordonPrefix):
		name := strings.TrimPrefix(key, CordonPrefix)
		if rev < c.cordonRev[name] {
			return // older than a change this API server made itself
		}
		var mark CordonMark
		if !deleted {
			var ok bool
			if mark, ok = openRecord(c, key, val, func(m CordonMark) bool { return m.Node == name && (m.Mode == "cordon" || m.Mode == "drain") }); !ok {
				return
			}
		}
		c.cordonRev[name] = rev
		if deleted {
			delete(c.cordon, name)
		} else {
			c.cordon[name] = mark.Mode
		}
	case strings.HasPrefix(key, SandboxPrefix):
		id := strings.TrimPrefix(key, SandboxPrefix)
		var r SandboxRecord
		if !deleted {
			var ok bool
			if r, ok = openRecord(c, key, val, func(r SandboxRecord) bool { return r.Sandbox.ID == id && r.Node != "" }); !ok {
				return // a record that does not open changes nothing
			}
		}
		if old, ok := c.sandboxes[id]; ok {
			c.perNode[old.Node]--
			delete(c.sandboxes, id)
		}
		if deleted {
			if c.deleted != nil {
				c.deleted[id] = time.Now()
				if len(c.deleted) > 4096 {
					for k, at := range c.deleted {
						if time.Since(at) > deletedMemory {
							delete(c.deleted, k)
						}
					}
				}
			}
			return
		}
		if c.recentlyDeleted(id) {
			// A lagging watch (its etcd member went away) delivering
			// the create after this API server's own kill: an ID
			// never comes back once its record is deleted.
			return
		}
		c.sandboxes[id] = r
		c.perNode[r.Node]++
	case strings.HasPrefix(key, TemplatePrefix):
		name, node := path.Split(strings.TrimPrefix(key, TemplatePrefix))
		name = strings.TrimSuffix(name, "/")
		if deleted {
			setNested(c.templates, name, node, service.TemplateInfo{}, true)
		} else if t, ok := openRecord(c, key, val, func(t service.TemplateInfo) bool { return t.Name == name }); ok {
			setNested(c.templates, name, node, t, false)
		}
	case strings.HasPrefix(key, VolumePrefix):
		id := strings.TrimPrefix(key, VolumePrefix)
		if deleted {
			delete(c.volumes, id)
		} else if v, ok := openRecord(c, key, val, func(v VolumeRecord) bool { return v.ID == id && v.Node != "" }); ok {
			c.volumes[id] = v
		}
	case strings.HasPrefix(key, SnapPrefix):
		id, node := path.Split(strings.TrimPrefix(key, SnapPrefix))
		id = strings.TrimSuffix(id, "/")
		if deleted {
			setNested(c.snaps, id, node, snapshot.Snapshot{}, true)
		} else if e, ok := openRecord(c, key, val, func(e SnapshotEntry) bool { return e.ID == id }); ok {
			sn := e.Snapshot()
			setNested(c.snaps, id, node, sn, false)
		}
	}
}

// openRecord decodes a sealed record and reports whether it opened with
// the cluster secret and names what its key names (check). A record that
// does not is logged and ignored: nothing is placed, routed or removed
// because of it. Callers hold c.mu (or own c).
func openRecord[T any](c *Cache, key string, val []byte, check func(T) bool) (T, bool) {
	var v T
	err := c.seal.Open(key, val, &v)
	if err == nil && !check(v) {
		err = fmt.Errorf("record %s names another object than its key: %w", key, secret.ErrUnsealed)
	}
	if err != nil {
		var zero T
		c.refuse(key, err)
		return zero, false
	}
	return v, true
}

// refuse logs a record that was ignored: the first few, then one in a
// thousand (a flood of forged keys must not flood the log).
func (c *Cache) refuse(key string, err error) {
	if n := c.refused.Add(1); n <= 10 || n%1000 == 0 {
		c.log.Warn("fleet: etcd record ignored: it does not open with the cluster secret (written without it?)", "key", key, "err", err, "ignored_so_far", n)
	}
}

// Refused returns how many etcd records this cache ignored because they
// did not open with the cluster secret.
func (c *Cache) Refused() int64 { return c.refused.Load() }

func setNested[T any](m map[string]map[string]T, k1, k2 string, v T, deleted bool) {
	if deleted {
		delete(m[k1], k2)
		if len(m[k1]) == 0 {
			delete(m, k1)
		}
		return
	}
	if m[k1] == nil {
		m[k1] = map[string]T{}
	}
	m[k1][k2] = v
}

// markGone ends the calls in flight to a lost node. Callers hold c.mu.
func (c *Cache) markGone(name string) {
	if ch, ok := c.gone[name]; ok {
		close(ch)
		delete(c.gone, name)
	}
}

// goneCh returns a channel closed when the node is lost (already closed
// if it is not alive now).
func (c *Cache) GoneCh(name string) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, alive := c.nodes[name]; !alive {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	ch, ok := c.gone[name]
	if !ok {
		ch = make(chan struct{})
		c.gone[name] = ch
	}
	return ch
}

// Nodes returns every node seen since start (alive or lost), with its
// cordon state and the sandboxes it holds.
func (c *Cache) Nodes() []NodeView {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []NodeView
	for name, n := range c.known {
		_, alive := c.nodes[name]
		if alive {
			n = c.nodes[name]
		}
		v := NodeView{NodeRecord: n, Alive: alive, LostAt: c.lostAt[name], Sandboxes: c.perNode[name]}
		v.Cordoned = c.cordon[name] != ""
		v.Draining = c.cordon[name] == "drain"
		out = append(out, v)
	}
	return out
}

// node returns a live node's record.
func (c *Cache) Node(name string) (NodeRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n, ok := c.nodes[name]
	return n, ok
}

// lostSince says when a node was last seen to go away (zero: unknown).
func (c *Cache) LostSince(name string) time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.lostAt[name]
}

// sandbox returns the record of a sandbox, if the cache has it.
func (c *Cache) Sandbox(id string) (SandboxRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.sandboxes[id]
	return r, ok
}

// deletedMemory is how long a deleted sandbox's ID keeps late events and
// answers from bringing its record back.
const deletedMemory = time.Minute

// recentlyDeleted says whether id's record was deleted within
// deletedMemory. Callers hold c.mu.
func (c *Cache) recentlyDeleted(id string) bool {
	at, ok := c.deleted[id]
	return ok && time.Since(at) < deletedMemory
}

// putSandbox records what this API server just learned from a node, ahead
// of the watch.
func (c *Cache) PutSandbox(r SandboxRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recentlyDeleted(r.Sandbox.ID) {
		return
	}
	if old, ok := c.sandboxes[r.Sandbox.ID]; ok {
		c.perNode[old.Node]--
	}
	c.sandboxes[r.Sandbox.ID] = r
	c.perNode[r.Node]++
}

// dropSandbox forgets a sandbox this API server just killed, ahead of
// the watch (a list right after the kill must not show it).
func (c *Cache) DropSandbox(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.sandboxes[id]; ok {
		c.perNode[old.Node]--
		delete(c.sandboxes, id)
	}
	c.deleted[id] = time.Now()
}

// setCordon records a cordon change this API server just made, ahead of
// the watch: a create right after `node drain` must not land on the node.
func (c *Cache) SetCordon(node, mode string, deleted bool, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if deleted {
		c.apply(CordonPrefix+node, nil, true, rev)
		return
	}
	if rev < c.cordonRev[node] {
		return
	}
	c.cordonRev[node] = rev
	c.cordon[node] = mode
}

// putSnapshot records a snapshot a node just made, ahead of the watch.
func (c *Cache) PutSnapshot(node string, sn snapshot.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snaps[sn.ID] == nil {
		c.snaps[sn.ID] = map[string]snapshot.Snapshot{}
	}
	c.snaps[sn.ID][node] = sn
}

// records returns the sandbox records of one node.
func (c *Cache) Records(node string) []SandboxRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []SandboxRecord
	for _, r := range c.sandboxes {
		if r.Node == node {
			out = append(out, r)
		}
	}
	return out
}

// forget drops a lost node from this API server's list of nodes seen.
func (c *Cache) Forget(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, alive := c.nodes[node]; !alive {
		delete(c.known, node)
		delete(c.lostAt, node)
	}
}

// liveMatching returns the sandboxes f matches whose node is alive, in
// one pass under the read lock.
func (c *Cache) LiveMatching(f sandbox.Filter) []sandbox.Sandbox {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []sandbox.Sandbox
	for _, r := range c.sandboxes {
		if _, ok := c.nodes[r.Node]; !ok {
			continue
		}
		if sb := r.Sandbox.sandbox(); f.Match(sb) {
			out = append(out, sb)
		}
	}
	return out
}

// templateHolders returns the live nodes holding a template or a snapshot
// of that name.
// Cordoned reports whether a cordon (or drain) mark holds for node.
func (c *Cache) Cordoned(node string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.cordon[node] != ""
}

// Len is how many sandbox records the cache holds (of live nodes or not).
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.sandboxes)
}

// SnapshotList returns one copy of each published snapshot.
func (c *Cache) SnapshotList() []snapshot.Snapshot {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []snapshot.Snapshot
	for _, byNode := range c.snaps {
		for _, sn := range byNode {
			out = append(out, sn)
			break
		}
	}
	return out
}

// TemplateList returns each template live nodes hold, ready where one
// of them has it ready.
func (c *Cache) TemplateList() []service.TemplateInfo {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []service.TemplateInfo
	for _, byNode := range c.templates {
		var ti service.TemplateInfo
		found := false
		for node, t := range byNode {
			if _, alive := c.nodes[node]; !alive {
				continue
			}
			if !found || t.Ready {
				ti, found = t, true
			}
		}
		if found {
			ti.InUse = 0
			out = append(out, ti)
		}
	}
	return out
}

func (c *Cache) Holders(name string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for node := range c.templates[name] {
		if _, ok := c.nodes[node]; ok {
			out = append(out, node)
		}
	}
	for node := range c.snaps[name] {
		if _, ok := c.nodes[node]; ok {
			out = append(out, node)
		}
	}
	return out
}

// SnapshotVolumes returns the volumes snapshot id's restore mounts
// (none for a template or an unknown name).
func (c *Cache) SnapshotVolumes(id string) []volume.Mount {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, sn := range c.snaps[id] {
		return sn.Volumes
	}
	return nil
}

// SnapshotOwner returns the owner of snapshot id as the nodes holding it
// published it; ok is false for an unknown ID or when they disagree.
func (c *Cache) SnapshotOwner(id string) (owner string, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	first := true
	for _, sn := range c.snaps[id] {
		if !first && sn.Owner != owner {
			return "", false
		}
		owner, first = sn.Owner, false
	}
	return owner, !first
}

// Volume returns a volume's record, if the cache has it.
func (c *Cache) Volume(id string) (VolumeRecord, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	v, ok := c.volumes[id]
	return v, ok
}

// Volumes returns owner's volumes (every volume for owner ""), of live
// nodes and lost ones.
func (c *Cache) Volumes(owner string) []VolumeRecord {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []VolumeRecord
	for _, v := range c.volumes {
		if owner == "" || v.Owner == owner {
			out = append(out, v)
		}
	}
	return out
}

// PutVolume records a volume a node just made, ahead of the watch.
func (c *Cache) PutVolume(v VolumeRecord) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes[v.ID] = v
}

// DropVolume forgets a volume this API server just deleted, ahead of
// the watch.
func (c *Cache) DropVolume(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.volumes, id)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
