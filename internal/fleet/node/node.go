// Package node is a fleet node agent: this host's sandbox stack (the very
// one `agentenv serve` runs), registered in etcd under a lease, serving
// the node service to API servers and copying templates and snapshots
// from its peers on demand. It publishes what it holds and each
// sandbox's record before it answers the call that changed it. It must
// not place sandboxes or know other nodes beyond the peers it copies from.
package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net/http"
	"os"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/singleflight"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// Config configures a node agent.
type Config struct {
	Name string
	// Advertise is the host:port API servers and other nodes reach this
	// node's RPC and proxy at.
	Advertise string
	Secret    string
	Etcd      *clientv3.Client
	// LeaseTTL is how long the node may go unheard before it counts as
	// lost (and its sandboxes with it).
	LeaseTTL     time.Duration
	MaxSandboxes int
	Log          *slog.Logger
	// TLS: the node serves HTTPS (RunNode sets it from the certificate
	// flags); PeerTLS verifies other nodes when copying from them.
	TLS     bool
	PeerTLS *tls.Config
	// RequireClientCert: the node serves mutual TLS; every route but
	// /health needs a verified client certificate.
	RequireClientCert bool
	// Metrics, if set, times the node's operations.
	Metrics *metrics.Registry
}

// Node is a node agent: this host's sandbox stack, published in etcd and
// served to API servers over the node RPC.
type Node struct {
	cfg      Config
	host     *service.Local
	cli      *clientv3.Client
	log      *slog.Logger
	px       *proxy.Proxy
	http     *http.Client
	seal     *secret.Sealer
	auth     secret.Auth
	verifier *secret.Verifier
	// claimed: this agent has held its name in etcd at least once (a
	// name held by another live node at the first try ends Run).
	claimed atomic.Bool

	// gate: creates and forks hold it shared, reconcile exclusively (a
	// sandbox being created has no record yet; reconcile must not take
	// it for a leftover).
	gate  sync.RWMutex
	locks [64]sync.Mutex

	leaseMu sync.RWMutex
	lease   clientv3.LeaseID
	// registered: the node key is written under the current lease (set
	// after reconcile; cleared when the lease is lost).
	registered atomic.Bool

	dirtyMu sync.Mutex
	dirty   map[string]bool
	kick    chan struct{}

	pubMu     sync.Mutex
	published map[string]string // key → value of template/snapshot keys under the lease
	// recorded maps the sandbox IDs with a record in etcd to the value
	// last written (a write of the same value is skipped: a create's
	// answer and its own state change would otherwise write it twice).
	recorded sync.Map

	fetch   singleflight.Group
	started time.Time
	tombs   *store.Tombstones
}

// NewNode returns a node agent; pass Changed as the sandbox manager's
// OnPersist, then call Run with the started host's service.Local.
func New(cfg Config) *Node {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 10 * time.Second
	}
	seal := secret.NewSealer(cfg.Secret)
	return &Node{cfg: cfg, cli: cfg.Etcd, log: cfg.Log, dirty: map[string]bool{}, kick: make(chan struct{}, 1),
		published: map[string]string{}, http: &http.Client{Transport: nodepb.NewTransport(cfg.PeerTLS)}, started: time.Now().UTC(),
		seal: seal, auth: secret.NewAuth(cfg.Secret), verifier: secret.NewVerifier(cfg.Secret), tombs: store.NewTombstones(cfg.Etcd, seal)}
}

// Changed is told of every persisted sandbox state; the record in etcd
// follows behind (timeouts, deaths; API calls publish before answering).
func (n *Node) Changed(sb sandbox.Sandbox) {
	n.dirtyMu.Lock()
	n.dirty[sb.ID] = true
	n.dirtyMu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Backend is the node's service.Backend: this host's, publishing each
// change in etcd before it answers.
func (n *Node) Backend() service.Backend { return &published{Local: n.host, n: n} }

// Run registers the node and keeps it registered until ctx ends: each
// time its lease is lost (cut off longer than the TTL), it reconciles
// with etcd and registers again. It returns an error at once if another
// live node holds this node's name at the first registration.
func (n *Node) Run(ctx context.Context, host *service.Local) error {
	n.Attach(host)
	go n.flushLoop(ctx)
	for ctx.Err() == nil {
		err := n.session(ctx)
		if errors.Is(err, errdefs.ErrConflict) && !n.claimed.Load() {
			return err
		}
		if err != nil && ctx.Err() == nil {
			n.log.Warn("fleet: node session ended; registering again", "err", err)
			sleep(ctx, time.Second)
		}
	}
	// Leave at once rather than after the TTL: API servers see the node go.
	n.leaseMu.RLock()
	lease := n.lease
	n.leaseMu.RUnlock()
	if lease != 0 {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		n.cli.Revoke(rctx, lease)
		cancel()
	}
	return nil
}

// attach sets the host the node serves (before Handler and Run).
func (n *Node) Attach(host *service.Local) {
	if n.host == nil {
		n.host = host
		n.px = proxy.New(host.Manager, n.log)
	}
}

// session is one lease: grant, reconcile, register, keep alive.
func (n *Node) session(ctx context.Context) error {
	defer n.registered.Store(false)
	g, err := n.cli.Grant(ctx, int64(n.cfg.LeaseTTL.Seconds()))
	if err != nil {
		return fmt.Errorf("etcd lease: %w", err)
	}
	n.gate.Lock()
	err = n.claim(ctx, g.ID)
	if err == nil {
		err = n.reconcile(ctx)
	}
	if err == nil {
		n.leaseMu.Lock()
		n.lease = g.ID
		n.leaseMu.Unlock()
		n.pubMu.Lock()
		n.published = map[string]string{}
		n.pubMu.Unlock()
		err = n.register(ctx)
	}
	n.gate.Unlock()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		n.cli.Revoke(rctx, g.ID)
		cancel()
		return err
	}
	n.claimed.Store(true)
	n.registered.Store(true)
	kctx, stopKeepAlive := context.WithCancel(ctx)
	defer func() {
		stopKeepAlive()
		if ctx.Err() == nil {
			// Ended by an error: the next session takes a new lease;
			// this one must not keep the old keys alive.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			n.cli.Revoke(rctx, g.ID)
			cancel()
		}
	}()
	ka, err := n.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		return fmt.Errorf("etcd keepalive: %w", err)
	}
	n.log.Info("fleet: node registered", "node", n.cfg.Name, "addr", n.cfg.Advertise, "lease_ttl", n.cfg.LeaseTTL)
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-ka:
			if !ok {
				return errors.New("lease lost (etcd unreachable for longer than the lease TTL)")
			}
		case <-tick.C:
			if err := n.register(ctx); err != nil {
				if !n.registered.Load() {
					return err // the record is not ours any more
				}
				n.log.Warn("fleet: updating node record", "err", err)
			}
		}
	}
}

func (n *Node) leaseID() clientv3.LeaseID {
	n.leaseMu.RLock()
	defer n.leaseMu.RUnlock()
	return n.lease
}

// claim takes this node's name in etcd under lease: the node key is
// created only if no live node holds it (a transaction on its create
// revision), so two agents with one name (cloned hosts share a host
// name) cannot overwrite each other's record or kill each other's
// sandboxes. A record left by this node's own previous run (same
// advertised address, which this process now listens on) is taken over.
func (n *Node) claim(ctx context.Context, lease clientv3.LeaseID) error {
	key := store.NodesPrefix + n.cfg.Name
	rec := n.nodeRecord()
	val, err := n.seal.Seal(key, rec)
	if err != nil {
		return err
	}
	for range 2 {
		resp, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return fmt.Errorf("etcd: claiming node name %s: %w", n.cfg.Name, err)
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // gone between the compare and the read
		}
		holder := kvs[0]
		if clientv3.LeaseID(holder.Lease) == lease {
			return nil
		}
		var other store.NodeRecord
		opened := n.seal.Open(key, holder.Value, &other) == nil
		if opened && other.Addr == n.cfg.Advertise {
			// This node's previous run: it cannot be alive, this
			// process holds its address. End its lease now.
			n.log.Info("fleet: taking over this node's record from its previous run", "node", n.cfg.Name)
			if _, err := n.cli.Revoke(ctx, clientv3.LeaseID(holder.Lease)); err != nil {
				n.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", holder.ModRevision)).Then(clientv3.OpDelete(key)).Commit()
			}
			continue
		}
		who := "a record that does not open with the cluster secret"
		if opened {
			who = fmt.Sprintf("the live node at %s (started %s)", other.Addr, other.StartedAt.Format(time.RFC3339))
		}
		return errdefs.Conflict("node name %q is held by %s, alive in etcd (lease %x): give this node a unique --name (cloned hosts share a host name), or stop the other one", n.cfg.Name, who, holder.Lease)
	}
	return errdefs.Conflict("node name %q: its record keeps coming back; is another agent starting with the same --name?", n.cfg.Name)
}

// check refuses to start a node whose name a live node holds (before
// this host's sandbox stack starts: a clone must not touch the host's
// networks either). claim is what guards the race of two starting at once.
func (n *Node) Check(ctx context.Context) error {
	key := store.NodesPrefix + n.cfg.Name
	resp, err := n.cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("etcd: reading node %s: %w", n.cfg.Name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var other store.NodeRecord
	if err := n.seal.Open(key, resp.Kvs[0].Value, &other); err != nil {
		return errdefs.Conflict("node name %q is held in etcd by a record that does not open with this cluster secret (another fleet sharing this etcd?): give this node another --name", n.cfg.Name)
	}
	if other.Addr == n.cfg.Advertise {
		return nil // this node's previous run
	}
	return errdefs.Conflict("node name %q is held by the live node at %s (started %s): give this node a unique --name (cloned hosts share a host name), or stop the other one",
		n.cfg.Name, other.Addr, other.StartedAt.Format(time.RFC3339))
}

func (n *Node) nodeRecord() store.NodeRecord {
	return store.NodeRecord{Name: n.cfg.Name, Addr: n.cfg.Advertise, TLS: n.cfg.TLS, StartedAt: n.started, Capacity: n.Capacity()}
}

// register writes the node record (capacity now) and the templates and
// snapshots it holds, all under its lease. What it holds is read under
// the same lock as the write, so that two registers cannot undo each
// other with stale lists.
func (n *Node) register(ctx context.Context) error {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	rec := n.nodeRecord()
	want := map[string]string{}
	b, _ := json.Marshal(rec)
	want[store.NodesPrefix+n.cfg.Name] = string(b)
	tmpls, _ := n.host.ListTemplates(ctx)
	for _, t := range tmpls {
		t.InUse = 0
		b, _ := json.Marshal(t)
		want[store.TemplatePrefix+t.Name+"/"+n.cfg.Name] = string(b)
	}
	for _, sn := range n.host.SnapshotStore.ListAll() {
		if sn.Internal {
			continue
		}
		sn.InUse = 0
		b, _ := json.Marshal(store.SnapshotOf(sn))
		want[store.SnapPrefix+sn.ID+"/"+n.cfg.Name] = string(b)
	}
	return n.sync(ctx, want)
}

// sync makes the lease's keys match want (plain JSON; sealed as they are
// written), writing only what changed. A node record whose free memory
// moved by less than 64 MiB counts as unchanged (it moves all the time).
// Every write is fenced on the node key still being this lease's: if it
// is gone (deleted by hand, or the lease lost), sync fails and the
// session claims the name again. Callers hold pubMu.
func (n *Node) sync(ctx context.Context, want map[string]string) error {
	lease := n.leaseID()
	var ops []clientv3.Op
	changed := map[string]string{}
	for k, v := range want {
		old, ok := n.published[k]
		if ok && (old == v || strings.HasPrefix(k, store.NodesPrefix) && sameNode(old, v)) {
			continue
		}
		changed[k] = v
		ops = append(ops, clientv3.OpPut(k, n.seal.SealBytes(k, []byte(v)), clientv3.WithLease(lease)))
	}
	var gone []string
	for k := range n.published {
		if _, ok := want[k]; !ok {
			gone = append(gone, k)
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	for len(ops) > 0 {
		batch := ops[:min(len(ops), 100)]
		ops = ops[len(batch):]
		resp, err := n.cli.Txn(ctx).If(n.holdsName(lease)).Then(batch...).Commit()
		if err != nil {
			// published still holds the old state: the next sync sends
			// the same (idempotent) changes again.
			return err
		}
		if !resp.Succeeded {
			n.registered.Store(false)
			return fmt.Errorf("node record %s is no longer this node's (deleted, or the lease was lost): registering again", store.NodesPrefix+n.cfg.Name)
		}
	}
	for _, k := range gone {
		delete(n.published, k)
	}
	maps.Copy(n.published, changed)
	return nil
}

// holdsName is the compare that fences a write on this node's lease
// holding its name.
func (n *Node) holdsName(lease clientv3.LeaseID) clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(store.NodesPrefix+n.cfg.Name), "=", lease)
}

func sameNode(a, b string) bool {
	var ra, rb store.NodeRecord
	if json.Unmarshal([]byte(a), &ra) != nil || json.Unmarshal([]byte(b), &rb) != nil {
		return false
	}
	if d := ra.Capacity.FreeMemoryMB - rb.Capacity.FreeMemoryMB; d < 64 && d > -64 {
		ra.Capacity.FreeMemoryMB = rb.Capacity.FreeMemoryMB
	}
	return ra == rb
}

// publishNow writes the lease's keys at once (after a snapshot, build or
// delete), so that API servers can use them when the call returns.
func (n *Node) publishNow(ctx context.Context) error {
	if !n.registered.Load() {
		return nil // the next registration publishes everything
	}
	if err := n.register(ctx); err != nil {
		return errdefs.Unavailable("publishing to etcd: %v", err)
	}
	return nil
}

func (n *Node) Capacity() store.Capacity {
	c := store.Capacity{CPUs: goruntime.NumCPU(), MaxSandboxes: n.cfg.MaxSandboxes}
	c.MemoryMB, c.FreeMemoryMB = meminfo()
	if n.host == nil {
		return c // not started yet (the name's claim)
	}
	c.Sandboxes = len(n.host.Manager.List(sandbox.Filter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}}))
	c.Templates = len(n.host.TemplateStore.List())
	c.Snapshots = len(n.host.SnapshotStore.ListAll())
	return c
}

// meminfo reads MemTotal and MemAvailable in MiB.
func meminfo() (total, avail int64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
			total = kb >> 10
		}
		if _, err := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); err == nil {
			avail = kb >> 10
		}
	}
	return total, avail
}

// reconcile makes etcd and this host agree after a (re)start or a lost
// lease: records of sandboxes still running here are adopted; records of
// sandboxes gone from here are removed with a tombstone; sandboxes
// running here without a record (killed by a client while this node was
// cut off) are killed.
func (n *Node) reconcile(ctx context.Context) error {
	resp, err := n.cli.Get(ctx, store.SandboxPrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("reading sandbox records: %w", err)
	}
	mine := map[string]bool{}
	for _, kv := range resp.Kvs {
		var r store.SandboxRecord
		key := string(kv.Key)
		if n.seal.Open(key, kv.Value, &r) == nil && r.Node == n.cfg.Name && store.SandboxPrefix+r.Sandbox.ID == key {
			mine[r.Sandbox.ID] = true
		}
	}
	local := map[string]bool{}
	for _, sb := range n.host.Manager.List(sandbox.Filter{States: []sandbox.State{sandbox.StateRunning, sandbox.StatePaused}}) {
		local[sb.ID] = true
	}
	adopted, killed := 0, 0
	var gone []string
	for id := range mine {
		if local[id] {
			n.recorded.Store(id, "") // recorded, and rewritten: this lease's first write
			if err := n.writeRecord(ctx, id, false); err != nil {
				return err
			}
			adopted++
			continue
		}
		gone = append(gone, id)
	}
	if err := n.tombs.Bury(ctx, gone, "its node "+n.cfg.Name+" restarted and the sandbox did not survive"); err != nil {
		return err
	}
	removed := len(gone)
	for id := range local {
		if mine[id] {
			continue
		}
		// Killed by a client while this node was cut off: the API
		// server left a sealed tombstone. A record that is merely
		// missing (deleted by someone who reached etcd, or etcd restored
		// from an old backup) kills nothing: the sandbox is recorded again.
		if _, ok := n.tombs.Read(ctx, id); ok {
			n.host.Manager.Kill(ctx, id)
			killed++
			continue
		}
		n.log.Warn("fleet: sandbox running here had no record in etcd and no tombstone: recording it again", "sandbox", id)
		n.recorded.Store(id, "")
		if err := n.writeRecord(ctx, id, false); err != nil {
			return err
		}
		adopted++
	}
	if err := n.reconcileVolumes(ctx); err != nil {
		return err
	}
	if adopted+removed+killed > 0 {
		n.log.Info("fleet: reconciled with etcd", "adopted", adopted, "records_removed", removed, "killed_unrecorded", killed)
	}
	return nil
}

// record makes the etcd record of sandbox id match this host: a running
// or paused sandbox has one, any other none. Calls for one ID are
// serialized, so a late writer cannot bring back a deleted record. Only a
// registered node writes (the write is fenced on its lease): a node cut
// off past its lease must not overwrite what clients did meanwhile (kill
// a lost sandbox); reconcile settles those IDs when it is back.
func (n *Node) record(ctx context.Context, id string) error {
	return n.writeRecord(ctx, id, true)
}

func (n *Node) writeRecord(ctx context.Context, id string, fenced bool) error {
	h := fnv.New32a()
	h.Write([]byte(id))
	l := &n.locks[h.Sum32()%uint32(len(n.locks))]
	l.Lock()
	defer l.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var ops []clientv3.Op
	var value string
	sb, err := n.host.Manager.Get(id)
	live := err == nil && sb.State.Live()
	switch {
	case live:
		b, _ := json.Marshal(store.RecordOf(n.cfg.Name, sb))
		value = string(b)
		if last, ok := n.recorded.Load(id); ok && last == value {
			return nil
		}
		ops = append(ops, clientv3.OpPut(store.SandboxPrefix+id, n.seal.SealBytes(store.SandboxPrefix+id, b)))
	default:
		if _, ok := n.recorded.Load(id); !ok {
			return nil // never published (still creating, or a pooled sandbox)
		}
		ops = append(ops, clientv3.OpDelete(store.SandboxPrefix+id))
		if errors.Is(err, sandbox.ErrLost) {
			t, terr := n.tombs.Put(ctx, id, err.Error())
			if terr != nil {
				return errdefs.Unavailable("removing sandbox %s from etcd: %v", id, terr)
			}
			ops = append(ops, t)
		}
	}
	txn := n.cli.Txn(ctx)
	if fenced {
		txn = txn.If(clientv3.Compare(clientv3.LeaseValue(store.NodesPrefix+n.cfg.Name), "=", n.leaseID()))
	}
	resp, terr := txn.Then(ops...).Commit()
	if terr != nil {
		return errdefs.Unavailable("writing sandbox %s to etcd: %v", id, terr)
	}
	if !resp.Succeeded {
		return errdefs.Unavailable("node %s is not registered in etcd (its lease was lost): sandbox %s is settled when it registers again; retry in a moment", n.cfg.Name, id)
	}
	if live {
		n.recorded.Store(id, value)
	} else {
		n.recorded.Delete(id)
	}
	return nil
}

// flushLoop writes the records of sandboxes that changed on their own.
func (n *Node) flushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		}
		n.dirtyMu.Lock()
		ids := n.dirty
		n.dirty = map[string]bool{}
		n.dirtyMu.Unlock()
		var failed []string
		var last error
		for id := range ids {
			if err := n.record(ctx, id); err != nil {
				failed, last = append(failed, id), err
			}
		}
		if len(failed) > 0 {
			// Put them back: etcd is away or the node is between leases;
			// the next try or the reconcile of the next lease settles them.
			n.log.Warn("fleet: sandbox records not written", "sandboxes", len(failed), "err", last)
			n.dirtyMu.Lock()
			for _, id := range failed {
				n.dirty[id] = true
			}
			n.dirtyMu.Unlock()
			sleep(ctx, time.Second)
			select {
			case n.kick <- struct{}{}:
			default:
			}
		}
	}
}

// Handler serves the node: /health and /metrics openly; the RPC, the
// exports and sandbox traffic only with the cluster secret.
func (n *Node) Handler() http.Handler {
	mux := http.NewServeMux()
	var b service.Backend = n.Backend()
	var px http.Handler = n.px
	if n.cfg.Metrics != nil {
		b = service.Metered(b, n.cfg.Metrics)
		px = proxy.Metered(n.cfg.Metrics, px)
	}
	mux.HandleFunc("POST "+nodepb.HTTPPath+"build", func(w http.ResponseWriter, r *http.Request) { serveBuild(b, w, r) })
	mux.Handle(ServiceHandler(b))
	mux.HandleFunc("GET "+nodepb.HTTPPath+"templates/{name}", n.exportTemplateMeta)
	mux.HandleFunc("GET "+nodepb.HTTPPath+"templates/{name}/image", n.exportTemplateImage)
	mux.HandleFunc("GET "+nodepb.HTTPPath+"layers/{digest}", n.exportLayer)
	mux.HandleFunc("GET "+nodepb.HTTPPath+"snapshots/{id}", n.exportSnapshotMeta)
	mux.HandleFunc("GET "+nodepb.HTTPPath+"snapshots/{id}/files/{file}", n.exportSnapshotFile)
	// A volume's content API, forwarded by API servers as the client sent
	// it (the volume's token is checked here, where it was signed).
	mux.HandleFunc(nodepb.HTTPPath+"volumecontent/{id}/{op}", func(w http.ResponseWriter, r *http.Request) { b.VolumeContent(w, r, r.PathValue("id")) })
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Id") == "" && r.URL.Path == "/health" {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"status":"ok"}` + "\n"))
			return
		}
		if n.cfg.RequireClientCert && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
			nodepb.WriteHTTPError(w, fmt.Errorf("this is a fleet node: callers need a client certificate of the fleet's CA (mutual TLS): %w", errdefs.ErrUnauthenticated))
			return
		}
		if err := n.verifier.Verify(r); err != nil {
			if errors.Is(err, errdefs.ErrUnauthenticated) {
				err = fmt.Errorf("this is a fleet node: only API servers and nodes with the cluster secret may call it, each request once, with clocks that agree within %s: %w", secret.Skew, err)
			}
			nodepb.WriteHTTPError(w, err)
			return
		}
		r.Header.Del(secret.AuthHeader)
		if r.Header.Get("E2b-Sandbox-Id") != "" {
			px.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
