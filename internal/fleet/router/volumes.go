package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/volume"
)

// Volumes in a fleet: a volume lives on the node that made it (no
// replication). Its record in etcd says which; every call about it, its
// content requests and the creates that mount it go to that node. While
// the node is away, its volumes answer 503 naming it; they answer again
// when it returns.

// volumeRecord finds volume id's record, as owner may see it ("": any):
// from the cache, else (made through another API server a moment ago)
// from etcd.
func (r *Remote) volumeRecord(ctx context.Context, owner, id string) (store.VolumeRecord, error) {
	if err := volume.CheckID(id); err != nil {
		return store.VolumeRecord{}, err // as a single host answers
	}
	rec, ok := r.cache.Volume(id)
	if !ok {
		ectx, cancel := context.WithTimeout(ctx, etcdTimeout)
		defer cancel()
		resp, err := r.cli.Get(ectx, store.VolumePrefix+id)
		if err != nil {
			return rec, errdefs.Unavailable("reading volume %s from etcd: %v", id, err)
		}
		if len(resp.Kvs) == 0 || r.seal.Open(store.VolumePrefix+id, resp.Kvs[0].Value, &rec) != nil || rec.ID != id {
			return store.VolumeRecord{}, errdefs.NotFound("volume %s not found", id)
		}
	}
	if owner != "" && rec.Owner != owner {
		return store.VolumeRecord{}, errdefs.NotFound("volume %s not found", id)
	}
	return rec, nil
}

// volumeNode returns the client of the node holding volume rec: a node
// that is away is ErrUnavailable, naming it.
func (r *Remote) volumeNode(rec store.VolumeRecord) (*nodeClient, error) {
	n, ok := r.cache.Node(rec.Node)
	if !ok {
		since := "it left the fleet"
		if t := r.cache.LostSince(rec.Node); !t.IsZero() {
			since = "its lease expired at " + t.UTC().Format(time.RFC3339)
		}
		return nil, errdefs.Unavailable("volume '%s' lives on node %s, which stopped answering (%s): a volume is on one node only, and answers again when that node returns",
			rec.Name, rec.Node, since)
	}
	return r.client(n), nil
}

func volumeOf(rec store.VolumeRecord) volume.Volume {
	return volume.Volume{ID: rec.ID, Name: rec.Name, Owner: rec.Owner, Created: rec.Created}
}

// CreateVolume makes the volume on a node chosen as for a sandbox (the
// most room); the node records it, its name unique per owner fleet-wide.
func (r *Remote) CreateVolume(ctx context.Context, owner, name string) (service.VolumeInfo, error) {
	order := r.place("", 0, false)
	if len(order) == 0 {
		return service.VolumeInfo{}, errdefs.Unavailable("no node can take a volume now (none alive and uncordoned; see `agentenv node list`)")
	}
	var errs []error
	for _, n := range order[:min(len(order), 3)] {
		resp, err := call(ctx, r.client(n).rpc.CreateVolume, &nodepb.CreateVolumeRequest{Owner: owner, Name: name})
		if err == nil {
			v := nodepb.ToVolume(resp)
			r.cache.PutVolume(store.VolumeRecord{ID: v.ID, Name: v.Name, Owner: v.Owner, Node: n.Name, Created: v.Created})
			return v, nil
		}
		// As for sandboxes: only a refusal that says nothing was made
		// moves on to the next node.
		if !errdefs.Retryable(err) || errors.Is(err, errOutcomeUnknown) {
			return service.VolumeInfo{}, err
		}
		errs = append(errs, err)
	}
	return service.VolumeInfo{}, errors.Join(errs...)
}

// ListVolumes answers from the cache (volumes of lost nodes included:
// they exist, and come back with their node).
func (r *Remote) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	recs := r.cache.Volumes(owner)
	sort.Slice(recs, func(i, j int) bool { return recs[i].Created.Before(recs[j].Created) })
	out := make([]volume.Volume, len(recs))
	for i, rec := range recs {
		out[i] = volumeOf(rec)
	}
	return out, nil
}

// GetVolume asks the volume's node, which signs a fresh content token.
func (r *Remote) GetVolume(ctx context.Context, owner, id string) (service.VolumeInfo, error) {
	rec, err := r.volumeRecord(ctx, owner, id)
	if err != nil {
		return service.VolumeInfo{}, err
	}
	c, err := r.volumeNode(rec)
	if err != nil {
		return service.VolumeInfo{}, err
	}
	resp, err := call(ctx, c.rpc.GetVolume, &nodepb.VolumeRef{Id: id, Owner: owner})
	if err != nil {
		return service.VolumeInfo{}, err
	}
	return nodepb.ToVolume(resp), nil
}

// VolumeByName finds owner's volume called name: in the cache, else
// through its name key in etcd. The owner matches exactly, as names are
// unique per owner (the default key's "" is an owner, not a wildcard).
func (r *Remote) VolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	for _, rec := range r.cache.Volumes(owner) {
		if rec.Name == name && rec.Owner == owner {
			return volumeOf(rec), nil
		}
	}
	ectx, cancel := context.WithTimeout(ctx, etcdTimeout)
	defer cancel()
	key := store.VolumeNameKey(owner, name)
	resp, err := r.cli.Get(ectx, key)
	if err != nil {
		return volume.Volume{}, errdefs.Unavailable("reading volume '%s' from etcd: %v", name, err)
	}
	if len(resp.Kvs) > 0 {
		if id, err := r.seal.OpenBytes(key, resp.Kvs[0].Value); err == nil {
			if rec, err := r.volumeRecord(ctx, owner, string(id)); err == nil && rec.Name == name {
				return volumeOf(rec), nil
			}
		}
	}
	return volume.Volume{}, errdefs.NotFound("volume '%s' not found", name)
}

// DeleteVolume deletes the volume on its node, which refuses while any
// of its sandboxes mounts it (naming them).
func (r *Remote) DeleteVolume(ctx context.Context, owner, id string) error {
	rec, err := r.volumeRecord(ctx, owner, id)
	if err != nil {
		return err
	}
	c, err := r.volumeNode(rec)
	if err != nil {
		return err
	}
	if _, err := call(ctx, c.rpc.DeleteVolume, &nodepb.VolumeRef{Id: id, Owner: owner}); err != nil {
		return err
	}
	r.cache.DropVolume(id)
	return nil
}

// VolumeContent forwards a content request, as the client sent it, to the
// volume's node, which checks the volume's token (it signed it) and
// serves it from its store.
func (r *Remote) VolumeContent(w http.ResponseWriter, req *http.Request, id string) {
	rec, err := r.volumeRecord(req.Context(), "", id)
	if err != nil {
		service.WriteContentError(w, err)
		return
	}
	c, err := r.volumeNode(rec)
	if err == nil {
		err = c.err
	}
	if err != nil {
		service.WriteContentError(w, err)
		return
	}
	target, err := url.Parse(c.base + nodepb.HTTPPath + "volumecontent/" + url.PathEscape(id) + "/" + path.Base(req.URL.Path))
	if err != nil {
		service.WriteContentError(w, errdefs.Invalid("volume content path: %v", err))
		return
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			u := *target
			u.RawQuery = pr.In.URL.RawQuery
			pr.Out.URL, pr.Out.Host = &u, u.Host
			if err := c.auth.Sign(pr.Out); err != nil {
				// The client's body could not be read (it went away):
				// unsigned, the node refuses the request.
				pr.Out.Header.Del(secret.AuthHeader)
			}
		},
		Transport:     r.http.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, req *http.Request, err error) {
			if errors.Is(context.Cause(req.Context()), errNodeLost) {
				service.WriteContentError(w, errdefs.Unavailable("volume '%s': its node %s was lost during the request", rec.Name, rec.Node))
				return
			}
			if req.Context().Err() != nil {
				return // the client went away
			}
			service.WriteContentError(w, errdefs.Unavailable("volume '%s': its node %s did not answer: %v", rec.Name, rec.Node, err))
		},
	}
	serveUntilLost(w, req, c.gone(), rp)
}

// volumesNode returns the node every volume of a create lives on: they
// must share one, alive and taking sandboxes.
func (r *Remote) volumesNode(ctx context.Context, mounts []volume.Mount) (store.NodeRecord, error) {
	var node string
	var where []string
	first := ""
	for _, m := range mounts {
		rec, err := r.volumeRecord(ctx, "", m.ID)
		if err != nil {
			return store.NodeRecord{}, err
		}
		where = append(where, fmt.Sprintf("'%s' on %s", rec.Name, rec.Node))
		if node == "" {
			node, first = rec.Node, rec.Name
		} else if rec.Node != node {
			return store.NodeRecord{}, errdefs.Invalid("the volumes of one sandbox must live on one node, and these live on different ones (%s): "+
				"a volume stays on the node it was made on, and sandboxes that mount it run there", strings.Join(where, ", "))
		}
	}
	rec := store.VolumeRecord{Name: first, Node: node}
	if _, err := r.volumeNode(rec); err != nil {
		return store.NodeRecord{}, err
	}
	for _, v := range r.cache.Nodes() {
		if v.Name != node {
			continue
		}
		if v.Cordoned {
			mode := "cordoned"
			if v.Draining {
				mode = "draining"
			}
			return store.NodeRecord{}, errdefs.Unavailable("volume '%s' lives on node %s, which is %s: sandboxes that mount it can only run there (uncordon the node, or wait)", first, node, mode)
		}
		return v.NodeRecord, nil
	}
	return store.NodeRecord{}, errdefs.Unavailable("volume '%s' lives on node %s, which is not in the fleet now", first, node)
}

// createWithVolumes creates the sandbox on the node of the volumes it
// mounts, the only place it can run.
func (r *Remote) createWithVolumes(ctx context.Context, req sandbox.CreateRequest, mounts []volume.Mount) (sandbox.Sandbox, error) {
	n, err := r.volumesNode(ctx, mounts)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	r.mu.Lock()
	r.pending[n.Name]++
	r.mu.Unlock()
	return r.createOn(ctx, n, req)
}

// forgetVolumes removes the records of a forgotten node's volumes (and
// their names), if the node is still gone: they went with it. A node that
// returns anyway records the volumes it still holds again.
func (r *Remote) forgetVolumes(ctx context.Context, node string) error {
	var ops []clientv3.Op
	for _, rec := range r.cache.Volumes("") {
		if rec.Node == node {
			ops = append(ops, clientv3.OpDelete(store.VolumePrefix+rec.ID), clientv3.OpDelete(store.VolumeNameKey(rec.Owner, rec.Name)))
		}
	}
	if len(ops) == 0 {
		return nil
	}
	_, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(store.NodesPrefix+node), "=", 0)).Then(ops...).Commit()
	if err != nil {
		return errdefs.Unavailable("etcd: %v", err)
	}
	return nil
}
