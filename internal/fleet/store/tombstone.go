package store

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/secret"
)

// Tombstones live a day: long enough for a client to learn why its
// sandbox is gone, short enough not to pile up. They share one lease per
// hour (a lease per tombstone would cost etcd a lease each).
const (
	tombstoneTTL   = 24 * time.Hour
	tombstoneReuse = time.Hour
)

// Tombstones grants and reuses the lease Tombstones are written under.
type Tombstones struct {
	cli  *clientv3.Client
	seal *secret.Sealer

	mu    sync.Mutex
	lease clientv3.LeaseID
	at    time.Time
}

// NewTombstones writes and reads tombstones sealed with seal.
func NewTombstones(cli *clientv3.Client, seal *secret.Sealer) *Tombstones {
	return &Tombstones{cli: cli, seal: seal}
}

// put returns the operation that writes a tombstone for sandbox id.
func (t *Tombstones) Put(ctx context.Context, id, reason string) (clientv3.Op, error) {
	val, err := t.seal.Seal(LostPrefix+id, Tombstone{ID: id, Reason: reason, At: time.Now().UTC()})
	if err != nil {
		return clientv3.Op{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lease == 0 || time.Since(t.at) > tombstoneReuse {
		g, err := t.cli.Grant(ctx, int64((tombstoneTTL + tombstoneReuse).Seconds()))
		if err != nil {
			return clientv3.Op{}, err
		}
		t.lease, t.at = g.ID, time.Now()
	}
	return clientv3.OpPut(LostPrefix+id, val, clientv3.WithLease(t.lease)), nil
}

// read returns the tombstone of sandbox id, if one that opens with the
// cluster secret is there.
func (t *Tombstones) Read(ctx context.Context, id string) (Tombstone, bool) {
	resp, err := t.cli.Get(ctx, LostPrefix+id)
	if err != nil || len(resp.Kvs) == 0 {
		return Tombstone{}, false
	}
	var ts Tombstone
	if t.seal.Open(LostPrefix+id, resp.Kvs[0].Value, &ts) != nil || ts.ID != id {
		return Tombstone{}, false
	}
	return ts, true
}

// bury removes sandbox records and leaves Tombstones saying why, in
// batches.
func (t *Tombstones) Bury(ctx context.Context, ids []string, reason string) error {
	var ops []clientv3.Op
	for _, id := range ids {
		op, err := t.Put(ctx, id, reason)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpDelete(SandboxPrefix+id), op)
	}
	for len(ops) > 0 {
		batch := ops[:min(len(ops), 128)]
		ops = ops[len(batch):]
		if _, err := t.cli.Txn(ctx).Then(batch...).Commit(); err != nil {
			return err
		}
	}
	return nil
}

// buryIfGone buries sandbox records of a node only while the node is not
// registered: if it came back meanwhile, its sandboxes are its own again
// (a kill goes to it) and nothing is removed.
func (t *Tombstones) BuryIfGone(ctx context.Context, node string, ids []string, reason string) error {
	var ops []clientv3.Op
	for _, id := range ids {
		op, err := t.Put(ctx, id, reason)
		if err != nil {
			return errdefs.Unavailable("etcd: %v", err)
		}
		ops = append(ops, clientv3.OpDelete(SandboxPrefix+id), op)
	}
	absent := clientv3.Compare(clientv3.CreateRevision(NodesPrefix+node), "=", 0)
	for len(ops) > 0 {
		batch := ops[:min(len(ops), 126)]
		ops = ops[len(batch):]
		resp, err := t.cli.Txn(ctx).If(absent).Then(batch...).Commit()
		if err != nil {
			return errdefs.Unavailable("etcd: %v", err)
		}
		if !resp.Succeeded {
			return errdefs.Conflict("node %s is back in the fleet: its sandboxes are reachable again; retry", node)
		}
	}
	return nil
}
