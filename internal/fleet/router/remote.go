// Package router is an API server's side of the fleet: Remote, the
// service.Backend that places new sandboxes on nodes and sends every other
// call to the node owning the sandbox (through the generated node service
// client), and Proxy, which routes sandbox traffic the same way. It keeps
// no state but the store's watch cache and its creates in flight; it must
// not run sandboxes or write a node's records.
package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// Remote is the service.Backend of an API server: it places new sandboxes on
// nodes and sends every other call to the node that owns the sandbox.
type Remote struct {
	cli   *clientv3.Client
	cache *store.Cache
	seal  *secret.Sealer
	auth  secret.Auth
	// tls: nodes must serve TLS (the API server was given a CA); a node
	// registered without it is refused, never called over plain HTTP.
	tls  bool
	log  *slog.Logger
	http *http.Client
	// Observe, if set, is told how long each placement took.
	Observe func(op string, d time.Duration, err error)

	mu      sync.Mutex
	pending map[string]int // creates sent to a node and not answered yet
	tombs   *store.Tombstones
	// clients holds a client per node address (clientKey).
	clients sync.Map
}

var _ service.Backend = (*Remote)(nil)

// NewRemote returns the backend of an API server. With tlsConf (the
// fleet's CA, and this API server's client certificate for mutual TLS)
// nodes are reached over TLS only; nil allows plain HTTP (a fleet on one
// host's loopback).
func NewRemote(cli *clientv3.Client, cache *store.Cache, clusterSecret string, tlsConf *tls.Config, log *slog.Logger) *Remote {
	seal := secret.NewSealer(clusterSecret)
	return &Remote{cli: cli, cache: cache, seal: seal, auth: secret.NewAuth(clusterSecret), tls: tlsConf != nil, log: log,
		http: &http.Client{Transport: nodepb.NewTransport(tlsConf)}, pending: map[string]int{}, tombs: store.NewTombstones(cli, seal)}
}

type clientKey struct {
	name, addr string
	tls        bool
}

// client returns the client of node n (made once per name and address).
func (r *Remote) client(n store.NodeRecord) *nodeClient {
	k := clientKey{n.Name, n.Addr, n.TLS}
	if c, ok := r.clients.Load(k); ok {
		return c.(*nodeClient)
	}
	c := newNodeClient(n, r.tls, r.auth, r.http, func() <-chan struct{} { return r.cache.GoneCh(n.Name) })
	got, _ := r.clients.LoadOrStore(k, c)
	return got.(*nodeClient)
}

// locate finds the node that owns a sandbox: from the cache, else (a
// sandbox created through another API server a moment ago) from etcd.
// A sandbox whose node is gone is reported lost, with why and since when.
func (r *Remote) locate(ctx context.Context, id string) (store.SandboxRecord, *nodeClient, error) {
	rec, ok := r.cache.Sandbox(id)
	if !ok {
		ectx, cancel := context.WithTimeout(ctx, etcdTimeout)
		defer cancel()
		resp, err := r.cli.Get(ectx, store.SandboxPrefix+id)
		if err != nil {
			return store.SandboxRecord{}, nil, errdefs.Unavailable("reading sandbox %s from etcd: %v", id, err)
		}
		if len(resp.Kvs) == 0 || r.seal.Open(store.SandboxPrefix+id, resp.Kvs[0].Value, &rec) != nil || rec.Sandbox.ID != id {
			return store.SandboxRecord{}, nil, r.notFound(ectx, id)
		}
	}
	n, ok := r.cache.Node(rec.Node)
	if !ok {
		since := "it left the fleet"
		if t := r.cache.LostSince(rec.Node); !t.IsZero() {
			since = "its lease expired at " + t.UTC().Format(time.RFC3339)
		}
		return rec, nil, fmt.Errorf("sandbox %q is lost: its node %s stopped answering (%s); it comes back if the node returns with it still running: %w",
			id, rec.Node, since, errdefs.ErrNotFound)
	}
	return rec, r.client(n), nil
}

// etcdTimeout bounds an API server's own etcd reads and writes: with etcd
// away, a request fails with 503 instead of hanging.
const etcdTimeout = 5 * time.Second

// notFound explains a sandbox with no record: a tombstone says why.
func (r *Remote) notFound(ctx context.Context, id string) error {
	if t, ok := r.tombs.Read(ctx, id); ok {
		return errdefs.NotFound("sandbox %q is gone: %s", id, t.Reason)
	}
	return errdefs.NotFound("sandbox %q does not exist (it was killed, timed out, or never existed)", id)
}

// Create places the sandbox: nodes ranked by free room and locality; a
// node that is full or failing is skipped for the next.
func (r *Remote) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	if req.Owner == "" {
		// The operator restoring a key's snapshot makes that key's
		// sandbox (as on one host). Said in the request: a node that
		// copies the snapshot takes its owner from here, not from the
		// peer it copies from.
		if owner, ok := r.cache.SnapshotOwner(req.Template); ok {
			req.Owner = owner
		}
	}
	if len(req.Volumes) > 0 {
		return r.createWithVolumes(ctx, req, req.Volumes)
	}
	if vols := r.cache.SnapshotVolumes(req.Template); len(vols) > 0 {
		// A restore mounts the snapshot's volumes again: their node only.
		return r.createWithVolumes(ctx, req, vols)
	}
	start := time.Now()
	// The first pick is counted as pending in the same critical section
	// that ranked it, so that a burst of creates spreads.
	order := r.place(req.Template, int64(req.MemoryMB), true)
	if r.Observe != nil {
		r.Observe("place", time.Since(start), nil)
	}
	if len(order) == 0 {
		return sandbox.Sandbox{}, errdefs.Unavailable("no node can take a sandbox now (none alive and uncordoned with room; see `agentenv node list`)")
	}
	var errs []error
	for i, n := range order {
		if i == 3 {
			break
		}
		if i > 0 {
			r.mu.Lock()
			r.pending[n.Name]++
			r.mu.Unlock()
		}
		sb, err := r.createOn(ctx, n, req)
		if err == nil {
			return sb, nil
		}
		// Only a refusal that says nothing about the request moves on;
		// after one that may have created the sandbox, another node would
		// make a second.
		if !errdefs.Retryable(err) || errors.Is(err, errOutcomeUnknown) {
			return sandbox.Sandbox{}, err
		}
		errs = append(errs, err)
	}
	return sandbox.Sandbox{}, errors.Join(errs...)
}

// createOn creates on n, which the caller counted as pending.
func (r *Remote) createOn(ctx context.Context, n store.NodeRecord, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	defer func() {
		r.mu.Lock()
		r.pending[n.Name]--
		r.mu.Unlock()
	}()
	c := r.client(n)
	resp, err := call(ctx, c.rpc.Create, nodepb.FromCreate(req))
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	sb := nodepb.ToSandbox(resp.GetSandbox())
	r.cache.PutSandbox(store.RecordOf(n.Name, sb))
	return sb, nil
}

// place ranks the live, uncordoned nodes for a sandbox from name; with
// reserve, the first is counted as pending.
func (r *Remote) place(name string, memMB int64, reserve bool) []store.NodeRecord {
	held := map[string]bool{}
	for _, h := range r.cache.Holders(name) {
		held[h] = true
	}
	views := r.cache.Nodes()
	byName := make(map[string]store.NodeRecord, len(views))
	cands := make([]Candidate, 0, len(views))
	r.mu.Lock()
	for _, v := range views {
		if !v.Alive || v.Cordoned {
			continue
		}
		byName[v.Name] = v.NodeRecord
		cands = append(cands, Candidate{
			Name: v.Name, Sandboxes: v.Sandboxes + r.pending[v.Name], MaxSandboxes: v.Capacity.MaxSandboxes,
			FreeMemoryMB: v.Capacity.FreeMemoryMB, NeedMemoryMB: memMB, Holds: held[v.Name],
		})
	}
	ranked := Place(cands)
	if reserve && len(ranked) > 0 {
		r.pending[ranked[0]]++
	}
	r.mu.Unlock()
	out := make([]store.NodeRecord, len(ranked))
	for i, name := range ranked {
		out[i] = byName[name]
	}
	return out
}

// List answers from the cache, unordered: the API layer orders and pages
// (a page of 100 keeps only 100 as it scans).
func (r *Remote) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	return r.cache.LiveMatching(f), nil
}

func (r *Remote) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	_, c, err := r.locate(ctx, id)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	resp, err := call(ctx, c.rpc.Get, &nodepb.SandboxRef{Id: id})
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	return nodepb.ToSandbox(resp.GetSandbox()), nil
}

// Kill stops a sandbox. A lost sandbox's record is removed (with a
// tombstone), so that its node kills it if it ever comes back.
func (r *Remote) Kill(ctx context.Context, id string) error {
	rec, c, err := r.locate(ctx, id)
	if c == nil && rec.Node != "" {
		ectx, cancel := context.WithTimeout(ctx, etcdTimeout)
		defer cancel()
		err = r.tombs.BuryIfGone(ectx, rec.Node, []string{id}, "killed while its node "+rec.Node+" was unreachable")
	} else if err == nil {
		_, err = call(ctx, c.rpc.Kill, &nodepb.SandboxRef{Id: id})
	}
	if err == nil {
		r.cache.DropSandbox(id)
	}
	return err
}

// onOwner runs a call on the node that owns sandbox id.
func onOwner[T any](r *Remote, ctx context.Context, id string, call func(*nodeClient) (T, error)) (T, error) {
	_, c, err := r.locate(ctx, id)
	if err != nil {
		var zero T
		return zero, err
	}
	return call(c)
}

// changed runs a call that changes sandbox id on its node and puts the
// answer in this API server's cache (a list right after shows it).
func changed[Req any](r *Remote, ctx context.Context, id string, f func(*nodeClient) func(context.Context, *connect.Request[Req]) (*connect.Response[nodepb.SandboxResponse], error), req *Req) (sandbox.Sandbox, error) {
	_, c, err := r.locate(ctx, id)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	resp, err := call(ctx, f(c), req)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	sb := nodepb.ToSandbox(resp.GetSandbox())
	r.cache.PutSandbox(store.RecordOf(c.name, sb))
	return sb, nil
}

func (r *Remote) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	return onOwner(r, ctx, id, func(c *nodeClient) (sandbox.Metric, error) {
		resp, err := call(ctx, c.rpc.Metrics, &nodepb.SandboxRef{Id: id})
		return nodepb.ToMetric(resp), err
	})
}

func (r *Remote) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.TimeoutRequest] { return c.rpc.SetTimeout }, &nodepb.TimeoutRequest{Id: id, Timeout: nodepb.D(d)})
}

func (r *Remote) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.TimeoutRequest] { return c.rpc.Extend }, &nodepb.TimeoutRequest{Id: id, Timeout: nodepb.D(d)})
}

func (r *Remote) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.SetNetworkRequest] { return c.rpc.SetNetwork }, &nodepb.SetNetworkRequest{Id: id, Network: nodepb.FromNetwork(n)})
}

func (r *Remote) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.PauseRequest] { return c.rpc.Pause }, &nodepb.PauseRequest{Id: id})
}

// PauseFiles pauses keeping only the files (service.FilesPauser), on the
// sandbox's node.
func (r *Remote) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.PauseRequest] { return c.rpc.Pause }, &nodepb.PauseRequest{Id: id, FilesOnly: true})
}

func (r *Remote) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return changed(r, ctx, id, func(c *nodeClient) rpcFunc[nodepb.TimeoutRequest] { return c.rpc.Resume }, &nodepb.TimeoutRequest{Id: id, Timeout: nodepb.D(d)})
}

// Connect resumes or extends the sandbox on its node, atomically there.
func (r *Remote) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	_, c, err := r.locate(ctx, id)
	if err != nil {
		return sandbox.Sandbox{}, false, err
	}
	resp, err := call(ctx, c.rpc.Connect, &nodepb.TimeoutRequest{Id: id, Timeout: nodepb.D(d)})
	if err != nil {
		return sandbox.Sandbox{}, false, err
	}
	sb := nodepb.ToSandbox(resp.GetSandbox())
	r.cache.PutSandbox(store.RecordOf(c.name, sb))
	return sb, resp.GetResumed(), nil
}

// rpcFunc is a node call that answers with a sandbox.
type rpcFunc[Req any] = func(context.Context, *connect.Request[Req]) (*connect.Response[nodepb.SandboxResponse], error)

// snapshotOn snapshots sandbox id on its node c.
func snapshotOn(ctx context.Context, c *nodeClient, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	resp, err := call(ctx, c.rpc.Snapshot, &nodepb.SnapshotRequest{Id: id, Name: req.Name, Metadata: req.Metadata, Automatic: req.Automatic})
	if err != nil {
		return snapshot.Snapshot{}, err
	}
	return nodepb.ToSnapshot(resp.GetSnapshot()), nil
}

func (r *Remote) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return onOwner(r, ctx, id, func(c *nodeClient) (snapshot.Snapshot, error) {
		sn, err := snapshotOn(ctx, c, id, req)
		if err == nil && !sn.Internal {
			r.cache.PutSnapshot(c.name, sn)
		}
		return sn, err
	})
}

// Fork restores the children on the parent's node, where its memory is,
// when that node has room for all of them and is not cordoned. Otherwise
// the parent is snapshotted once and each child is placed like a create
// from that snapshot: the parent's node first while it has room (it holds
// the snapshot), then others, which copy it.
func (r *Remote) Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error) {
	rec, c, err := r.locate(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.reserve(c.name, count) {
		resp, err := call(ctx, c.rpc.Fork, &nodepb.ForkRequest{Id: id, Count: int32(count), Timeout: nodepb.D(d), Metadata: metadata})
		r.mu.Lock()
		r.pending[c.name] -= count
		r.mu.Unlock()
		if err != nil {
			return nil, err
		}
		res := make([]sandbox.ForkResult, len(resp.GetChildren()))
		for i, ch := range resp.GetChildren() {
			res[i] = sandbox.ForkResult{Sandbox: nodepb.ToSandbox(ch.GetSandbox()), Err: nodepb.FromChildErr(ch.GetError())}
			if res[i].Err == nil {
				r.cache.PutSandbox(store.RecordOf(c.name, res[i].Sandbox))
			}
		}
		return res, nil
	}
	if count < 1 || count > 100 {
		return nil, errdefs.Invalid("fork count %d out of range: give 1..100", count)
	}
	if len(rec.Sandbox.Volumes) > 0 {
		// Its children mount its volumes, which live on its node only.
		return nil, errdefs.Unavailable("sandbox %s mounts volumes of node %s, which cannot take %d more sandboxes now (full, cordoned or draining): its fork children can only run there",
			id, c.name, count)
	}
	sn, err := snapshotOn(ctx, c, id, sandbox.SnapshotRequest{Metadata: map[string]string{forkOfKey: id}, Automatic: true})
	if err != nil {
		return nil, err
	}
	r.log.Info("fleet: fork spills over the parent's node", "sandbox", id, "node", c.name, "children", count, "snapshot", sn.ID)
	network := rec.Sandbox.Network
	if metadata == nil {
		metadata = rec.Sandbox.Metadata // as a fork on the parent's node does
	}
	res := make([]sandbox.ForkResult, count)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			res[i].Sandbox, res[i].Err = r.Create(ctx, sandbox.CreateRequest{Template: sn.ID, Timeout: d, Metadata: metadata, Network: &network, Owner: rec.Sandbox.Owner})
		})
	}
	wg.Wait()
	return res, nil
}

// forkOfKey marks the snapshot a fork spilling over its parent's node
// makes (metadata: the parent's ID); listings leave it out.
const forkOfKey = "agentenv.fork-of"

// reserve counts n sandboxes as pending on a node if it has room for them
// and is not cordoned (the caller releases them when the call returns).
func (r *Remote) reserve(node string, n int) bool {
	v, err := r.nodeKnown(node)
	if err != nil || !v.Alive || v.Cordoned {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v.Capacity.MaxSandboxes > 0 && v.Capacity.MaxSandboxes-v.Sandboxes-r.pending[node] < n {
		return false
	}
	r.pending[node] += n
	return true
}

// snapshots returns one copy of each published snapshot, oldest first.
func (r *Remote) snapshots() []snapshot.Snapshot {
	out := r.cache.SnapshotList()
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

func (r *Remote) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	var out []snapshot.Snapshot
	for _, sn := range r.snapshots() {
		// A fork's spill-over snapshot is the fleet's, not the user's.
		if !sn.Internal && sn.Metadata[forkOfKey] == "" && (sandboxID == "" || sn.Sandbox == sandboxID) {
			out = append(out, sn)
		}
	}
	return out, nil
}

func (r *Remote) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	for _, sn := range r.snapshots() {
		if sn.ID == id || (sn.Name != "" && sn.Name == id) {
			return sn, nil
		}
	}
	// Made through another API server a moment ago: ask etcd.
	if resp, err := r.cli.Get(ctx, store.SnapPrefix+id+"/", clientv3.WithPrefix()); err == nil {
		for _, kv := range resp.Kvs {
			var e store.SnapshotEntry
			if r.seal.Open(string(kv.Key), kv.Value, &e) == nil && e.ID == id {
				return e.Snapshot(), nil
			}
		}
	}
	return snapshot.Snapshot{}, errdefs.NotFound("snapshot %q does not exist on any live node", id)
}

// DeleteSnapshot deletes every copy.
func (r *Remote) DeleteSnapshot(ctx context.Context, id string) error {
	return r.onHolders(ctx, id, "snapshot", func(c *nodeClient) error {
		_, err := call(ctx, c.rpc.DeleteSnapshot, &nodepb.SnapshotRef{Id: id})
		return err
	})
}

// onHolders runs call on every live node holding name.
func (r *Remote) onHolders(ctx context.Context, name, what string, call func(*nodeClient) error) error {
	holders, err := r.freshHolders(ctx, name)
	if err != nil {
		return err
	}
	if len(holders) == 0 {
		return errdefs.NotFound("%s %q does not exist on any live node", what, name)
	}
	var errs []error
	for _, h := range holders {
		n, ok := r.cache.Node(h)
		if !ok {
			continue
		}
		if err := call(r.client(n)); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// freshHolders returns the live nodes holding a template or snapshot:
// from the cache, else (made through another API server a moment ago,
// not yet seen by the watch) from etcd.
func (r *Remote) freshHolders(ctx context.Context, name string) ([]string, error) {
	if h := r.cache.Holders(name); len(h) > 0 {
		return h, nil
	}
	var out []string
	for _, kind := range []string{store.SnapPrefix, store.TemplatePrefix} {
		resp, err := r.cli.Get(ctx, kind+name+"/", clientv3.WithPrefix())
		if err != nil {
			return nil, errdefs.Unavailable("reading %s from etcd: %v", name, err)
		}
		for _, kv := range resp.Kvs {
			node := strings.TrimPrefix(string(kv.Key), kind+name+"/")
			if _, err := r.seal.OpenBytes(string(kv.Key), kv.Value); err != nil {
				continue // not written by a node of this fleet
			}
			if _, alive := r.cache.Node(node); alive {
				out = append(out, node)
			}
		}
	}
	return out, nil
}

func (r *Remote) ListTemplates(ctx context.Context) ([]service.TemplateInfo, error) {
	out := r.cache.TemplateList()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (r *Remote) GetTemplate(ctx context.Context, name string) (service.TemplateInfo, error) {
	list, _ := r.ListTemplates(ctx)
	for _, t := range list {
		if t.Name == name {
			return t, nil
		}
	}
	return service.TemplateInfo{}, errdefs.NotFound("template %q does not exist on any live node (list them with `agentenv template list`)", name)
}

// DeleteTemplate deletes a template (or snapshot) on every node holding it.
func (r *Remote) DeleteTemplate(ctx context.Context, name string) error {
	return r.onHolders(ctx, name, "template", func(c *nodeClient) error {
		_, err := call(ctx, c.rpc.DeleteTemplate, &nodepb.TemplateRef{Name: name})
		return err
	})
}

// BuildTemplate builds on the node with the most room; other nodes copy
// the template from it on first use.
func (r *Remote) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	order := r.place("", 0, false)
	if len(order) == 0 {
		return service.TemplateInfo{}, errdefs.Unavailable("no node can build a template now (none alive and uncordoned)")
	}
	return r.client(order[0]).BuildTemplate(ctx, req, progress)
}

// Cordon marks a node so that placement skips it ("drain" also tells
// operators to move work off it); Uncordon clears the mark.
func (r *Remote) Cordon(ctx context.Context, node, mode string) error {
	if _, err := r.nodeKnown(node); err != nil {
		return err
	}
	val, err := r.seal.Seal(store.CordonPrefix+node, store.CordonMark{Node: node, Mode: mode})
	if err != nil {
		return err
	}
	resp, err := r.cli.Put(ctx, store.CordonPrefix+node, val)
	if err != nil {
		return errdefs.Unavailable("etcd: %v", err)
	}
	r.cache.SetCordon(node, mode, false, resp.Header.Revision)
	return nil
}

// Forget removes a lost node for good: its sandbox records go (with
// tombstones saying why) and the node leaves listings. A node that comes
// back later kills what it still runs (nothing has a record) and joins
// as new.
func (r *Remote) Forget(ctx context.Context, node string) error {
	v, err := r.nodeKnown(node)
	if err != nil {
		return err
	}
	if v.Alive {
		return errdefs.Conflict("node %q is alive: only a lost node can be forgotten (drain it, then stop its agent)", node)
	}
	var ids []string
	for _, rec := range r.cache.Records(node) {
		ids = append(ids, rec.Sandbox.ID)
	}
	if err := r.tombs.BuryIfGone(ctx, node, ids, "its node "+node+" was lost and removed from the fleet"); err != nil {
		return err
	}
	if err := r.forgetVolumes(ctx, node); err != nil {
		return err
	}
	for _, id := range ids {
		r.cache.DropSandbox(id)
	}
	if _, err := r.cli.Delete(ctx, store.CordonPrefix+node); err != nil {
		return errdefs.Unavailable("etcd: %v", err)
	}
	r.cache.Forget(node)
	r.log.Info("fleet: node forgotten", "node", node, "sandboxes", len(ids))
	return nil
}

// Uncordon lets placement use a node again.
func (r *Remote) Uncordon(ctx context.Context, node string) error {
	if _, err := r.nodeKnown(node); err != nil {
		return err
	}
	resp, err := r.cli.Delete(ctx, store.CordonPrefix+node)
	if err != nil {
		return errdefs.Unavailable("etcd: %v", err)
	}
	r.cache.SetCordon(node, "", true, resp.Header.Revision)
	return nil
}

func (r *Remote) nodeKnown(name string) (store.NodeView, error) {
	for _, v := range r.cache.Nodes() {
		if v.Name == name {
			return v, nil
		}
	}
	return store.NodeView{}, errdefs.NotFound("node %q is not in the fleet (see `agentenv node list`)", name)
}

// Nodes lists the fleet's nodes.
func (r *Remote) Nodes() []store.NodeView {
	out := r.cache.Nodes()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NodeList is Nodes for the API's node routes.
func (r *Remote) NodeList(ctx context.Context) (any, error) { return r.Nodes(), nil }

var (
	_ service.Fleet       = (*Remote)(nil)
	_ service.FilesPauser = (*Remote)(nil)
)
