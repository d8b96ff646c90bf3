package node

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/service"
)

// A volume lives on the node that made it. The node records it in etcd
// (volumes/<id>, not under its lease: a lost node's volumes are reported
// unavailable, not forgotten) together with its name key, in one
// transaction that fails if the owner already has a volume of that name
// anywhere in the fleet.

// CreateVolume makes the volume here, then records it; if the name is
// taken in the fleet (or the record cannot be written), the volume goes.
func (p *published) CreateVolume(ctx context.Context, owner, name string) (service.VolumeInfo, error) {
	v, err := p.Local.CreateVolume(ctx, owner, name)
	if err != nil {
		return v, err
	}
	if err := p.n.recordVolume(ctx, v); err != nil {
		if derr := p.Local.DeleteVolume(context.WithoutCancel(ctx), owner, v.ID); derr != nil {
			p.n.log.Warn("fleet: removing a volume whose record was refused", "volume", v.ID, "err", derr)
		}
		return service.VolumeInfo{}, err
	}
	return v, nil
}

// DeleteVolume deletes the volume here (refused while mounted), then its
// record and name key.
func (p *published) DeleteVolume(ctx context.Context, owner, id string) error {
	v, err := p.Local.GetVolume(ctx, owner, id)
	if err != nil {
		return err
	}
	if err := p.Local.DeleteVolume(ctx, owner, id); err != nil {
		return err
	}
	return p.n.dropVolume(ctx, v.ID, v.Owner, v.Name)
}

func (n *Node) recordVolume(ctx context.Context, v service.VolumeInfo) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec := store.VolumeRecord{ID: v.ID, Name: v.Name, Owner: v.Owner, Node: n.cfg.Name, Created: v.Created}
	b, _ := json.Marshal(rec)
	key, nameKey := store.VolumePrefix+v.ID, store.VolumeNameKey(v.Owner, v.Name)
	resp, err := n.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0), n.holdsName(n.leaseID())).
		Then(clientv3.OpPut(key, n.seal.SealBytes(key, b)), clientv3.OpPut(nameKey, n.seal.SealBytes(nameKey, []byte(v.ID)))).
		Else(clientv3.OpGet(nameKey)).Commit()
	if err != nil {
		return errdefs.Unavailable("recording volume %s in etcd: %v", v.Name, err)
	}
	if resp.Succeeded {
		return nil
	}
	if len(resp.Responses) > 0 && len(resp.Responses[0].GetResponseRange().Kvs) > 0 {
		// The message serve gives for a duplicate name.
		return errdefs.Invalid("volume with name '%s' already exists", v.Name)
	}
	return errdefs.Unavailable("node %s is not registered in etcd (its lease was lost): retry in a moment", n.cfg.Name)
}

// dropVolume removes a deleted volume's record and its name key (if it
// still names this volume).
func (n *Node) dropVolume(ctx context.Context, id, owner, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nameKey := store.VolumeNameKey(owner, name)
	ops := []clientv3.Op{clientv3.OpDelete(store.VolumePrefix + id)}
	if resp, err := n.cli.Get(ctx, nameKey); err == nil && len(resp.Kvs) > 0 {
		if got, err := n.seal.OpenBytes(nameKey, resp.Kvs[0].Value); err == nil && string(got) == id {
			ops = append(ops, clientv3.OpDelete(nameKey))
		}
	}
	if _, err := n.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		// The volume is gone here; the next reconcile removes its record.
		return errdefs.Unavailable("volume %s deleted, but its record stays in etcd until this node registers again: %v", id, err)
	}
	return nil
}

// reconcileVolumes removes the records of volumes this node no longer
// holds (deleted while etcd was away) and records those it holds
// without one.
func (n *Node) reconcileVolumes(ctx context.Context) error {
	if n.host.Volumes == nil {
		return nil
	}
	resp, err := n.cli.Get(ctx, store.VolumePrefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("reading volume records: %w", err)
	}
	have := map[string]bool{}
	for _, v := range n.host.Volumes.Volumes("") {
		have[v.ID] = true
	}
	recorded := map[string]bool{}
	for _, kv := range resp.Kvs {
		var rec store.VolumeRecord
		key := string(kv.Key)
		if n.seal.Open(key, kv.Value, &rec) != nil || rec.Node != n.cfg.Name || store.VolumePrefix+rec.ID != key {
			continue
		}
		recorded[rec.ID] = true
		if !have[rec.ID] {
			if err := n.dropVolume(ctx, rec.ID, rec.Owner, rec.Name); err != nil {
				return err
			}
		}
	}
	for _, v := range n.host.Volumes.Volumes("") {
		if recorded[v.ID] {
			continue
		}
		rec := store.VolumeRecord{ID: v.ID, Name: v.Name, Owner: v.Owner, Node: n.cfg.Name, Created: v.Created}
		b, _ := json.Marshal(rec)
		key, nameKey := store.VolumePrefix+v.ID, store.VolumeNameKey(v.Owner, v.Name)
		put := clientv3.OpPut(key, n.seal.SealBytes(key, b))
		_, err := n.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(nameKey), "=", 0)).
			Then(put, clientv3.OpPut(nameKey, n.seal.SealBytes(nameKey, []byte(v.ID)))).Else(put).Commit()
		if err != nil {
			return fmt.Errorf("recording volume %s: %w", v.ID, err)
		}
	}
	return nil
}
