package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// Data moves between nodes on demand: a create on a node that lacks its
// template or snapshot first copies it from a node that has it. Templates
// travel as a tar of their root filesystem (the receiver builds it like an
// upload); snapshots as their description (each file's extents, each
// chunk's size) plus the chunks the receiver lacks, each checked against
// its content-addressed name and resumed with a Range request when a
// transfer breaks. Peers are not trusted: what one sends is checked
// before it is used as a path, a size or an identity (copySnapshot).

// fetchAttempts bounds the resumptions of one file transfer.
const fetchAttempts = 4

// ensure makes name (a template or snapshot, "" for the default) present
// on this node, copying it from a peer if it is not; a snapshot copied
// for owner (the key the request is for, "" the operator) is owner's.
func (n *Node) ensure(ctx context.Context, name, owner string) error {
	if name == "" || n.host.SnapshotStore.Has(name) {
		return nil
	}
	if _, err := n.host.TemplateStore.Get(name); err == nil {
		return nil
	}
	// One copy per name and owner; a caller that gives up stops waiting
	// (the copy goes on for the others).
	ch := n.fetch.DoChan(owner+"\x00"+name, func() (any, error) { return nil, n.copyIn(context.WithoutCancel(ctx), name, owner) })
	select {
	case res := <-ch:
		return res.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyIn copies name from a live peer that holds it.
func (n *Node) copyIn(ctx context.Context, name, owner string) error {
	for _, kind := range []string{store.SnapPrefix, store.TemplatePrefix} {
		peer, ok, err := n.peerHolding(ctx, kind, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if kind == store.SnapPrefix {
			return n.copySnapshot(ctx, peer, name, owner)
		}
		return n.copyTemplate(ctx, peer, name)
	}
	return nil // not anywhere: the create says it does not exist
}

// peerHolding finds a live node other than this one under kind/name/.
func (n *Node) peerHolding(ctx context.Context, kind, name string) (store.NodeRecord, bool, error) {
	resp, err := n.cli.Get(ctx, kind+name+"/", clientv3.WithPrefix())
	if err != nil {
		return store.NodeRecord{}, false, errdefs.Unavailable("etcd: %v", err)
	}
	for _, kv := range resp.Kvs {
		peer := strings.TrimPrefix(string(kv.Key), kind+name+"/")
		if peer == n.cfg.Name {
			continue
		}
		nr, err := n.cli.Get(ctx, store.NodesPrefix+peer)
		if err != nil || len(nr.Kvs) == 0 {
			continue
		}
		var rec store.NodeRecord
		if n.seal.Open(store.NodesPrefix+peer, nr.Kvs[0].Value, &rec) == nil && rec.Name == peer && n.seal.Open(string(kv.Key), kv.Value, &json.RawMessage{}) == nil {
			return rec, true, nil
		}
	}
	return store.NodeRecord{}, false, nil
}

// peerGet asks a peer for path from offset; with sparse, it asks for the
// sparse encoding (sparse.go), which the answer may or may not use.
func (n *Node) peerGet(ctx context.Context, peer store.NodeRecord, path string, offset int64, sparse bool) (*http.Response, error) {
	base, err := peer.BaseURL(n.cfg.PeerTLS != nil)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+nodepb.HTTPPath+path, nil)
	if err != nil {
		return nil, err
	}
	if sparse {
		req.Header.Set(sparseHeader, "1")
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	// Last: the MAC covers the range and encoding asked for.
	if err := n.auth.Sign(req); err != nil {
		return nil, err
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return nil, errdefs.Unavailable("copying from node %s: %v", peer.Name, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		defer resp.Body.Close()
		return nil, nodepb.ReadHTTPError(resp)
	}
	return resp, nil
}

// templateCopy is a template's metadata as a peer sends it, with the
// SHA-256 of its image.
type templateCopy struct {
	Template template.Template `json:"template"`
	SHA256   string            `json:"sha256"`
}

// Bounds on the descriptions a peer sends (a snapshot's lists every
// extent of its files: ~100 bytes each).
const (
	maxTemplateMeta = 1 << 20
	maxManifest     = 64 << 20
)

// errPeerData marks what a peer sent that is not what it declared (more
// bytes, a frame past the end): a retry would not help.
var errPeerData = errors.New("not what the peer declared")

// fromPeer says which node sent what. What a peer sent wrong is not the
// client's fault: an invalid description or a broken copy is classed
// unavailable (another node may hold a good copy).
func fromPeer(peer store.NodeRecord, what string, err error) error {
	if !errdefs.Classified(err) || errors.Is(err, errdefs.ErrInvalid) {
		return errdefs.Unavailable("%s from node %s (%s): %v", what, peer.Name, peer.Addr, err)
	}
	return fmt.Errorf("%s from node %s (%s): %w", what, peer.Name, peer.Addr, err)
}

// peerJSON reads the JSON description a peer answers path with, at most
// limit bytes of it.
func (n *Node) peerJSON(ctx context.Context, peer store.NodeRecord, path string, limit int64, v any) error {
	resp, err := n.peerGet(ctx, peer, path, 0, false)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, limit)).Decode(v); err != nil {
		return errdefs.Unavailable("%s from node %s (%s): undecodable (at most %d bytes): %v", path, peer.Name, peer.Addr, limit, err)
	}
	return nil
}

// copyTemplate copies a template's EROFS image byte for byte (a rebuild
// would differ, and snapshots restore only onto the image they were taken
// on), then makes it ready in the background. The peer's answer must be
// the template asked for, with its image's SHA-256 and a size that fits
// on this node; the image must be exactly that size and hash.
func (n *Node) copyTemplate(ctx context.Context, peer store.NodeRecord, name string) error {
	if err := template.ValidName(name); err != nil {
		return err
	}
	n.log.Info("fleet: copying template from a peer", "template", name, "from", peer.Name)
	var tc templateCopy
	if err := n.peerJSON(ctx, peer, "templates/"+name, maxTemplateMeta, &tc); err != nil {
		return err
	}
	what := "template " + name
	switch sum, err := hex.DecodeString(tc.SHA256); {
	case tc.Template.Name != name:
		return fromPeer(peer, what, errdefs.Invalid("the answer describes template %q: refused", tc.Template.Name))
	case err != nil || len(sum) != sha256.Size:
		return fromPeer(peer, what, errdefs.Invalid("the answer has no SHA-256 of the image (%q): refused", tc.SHA256))
	case tc.Template.ImageSize <= 0:
		return fromPeer(peer, what, errdefs.Invalid("the answer declares a %d-byte image: refused", tc.Template.ImageSize))
	}
	dir := filepath.Dir(filepath.Dir(n.host.TemplateStore.ImagePath(name)))
	if free, err := freeBytes(dir); err == nil && tc.Template.ImageSize > free {
		return fromPeer(peer, what, fmt.Errorf("its image declares %d bytes, %d are free: %w", tc.Template.ImageSize, free, errdefs.ErrResourceExhausted))
	}
	// A layered template: the layers below its image this node lacks
	// first, each checked against its digest, all held until the template
	// stacks on them.
	release, err := n.copyLayers(ctx, peer, what, dir, tc.Template.Lowers)
	if err != nil {
		return err
	}
	defer release()
	resp, err := n.peerGet(ctx, peer, "templates/"+name+"/image", 0, false)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	image := &sizedBody{r: resp.Body, left: tc.Template.ImageSize}
	if _, err := n.host.TemplateStore.Adopt(ctx, tc.Template, image, strings.ToLower(tc.SHA256)); err != nil {
		return fromPeer(peer, what, err)
	}
	go func() {
		if err := n.host.Manager.MakeReady(context.WithoutCancel(ctx), name, false); err != nil {
			n.log.Warn("fleet: copied template not ready; its sandboxes boot", "template", name, "err", err)
		}
	}()
	return n.publishNow(ctx)
}

// copyLayers copies from peer the layers of digests this node lacks; a
// layer it has is not asked for. Each must hash to its digest. Every layer
// of digests is held from before it is looked for until release, so the
// store's sweep cannot remove one between its copy (or the check that it
// is here) and the template or snapshot that needs it; release is nil
// when err is not.
func (n *Node) copyLayers(ctx context.Context, peer store.NodeRecord, what, dir string, digests []string) (release func(), err error) {
	ts := n.host.TemplateStore
	for _, d := range digests {
		if !template.IsDigest(d) {
			return nil, fromPeer(peer, what, errdefs.Invalid("the answer names layer %q, not a SHA-256 digest: refused", d))
		}
	}
	release = ts.HoldLayers(digests)
	if err := n.fetchLayers(ctx, peer, what, dir, digests); err != nil {
		release()
		return nil, err
	}
	return release, nil
}

func (n *Node) fetchLayers(ctx context.Context, peer store.NodeRecord, what, dir string, digests []string) error {
	ts := n.host.TemplateStore
	for _, d := range digests {
		if ts.HasLayer(d) {
			continue
		}
		resp, err := n.peerGet(ctx, peer, "layers/"+d, 0, false)
		if err != nil {
			return err
		}
		free, ferr := freeBytes(dir)
		if ferr == nil && resp.ContentLength > free {
			resp.Body.Close()
			return fromPeer(peer, what, fmt.Errorf("its layer sha256:%s has %d bytes, %d are free: %w", d[:12], resp.ContentLength, free, errdefs.ErrResourceExhausted))
		}
		body := io.Reader(resp.Body)
		if ferr == nil {
			body = io.LimitReader(resp.Body, free+1)
		}
		err = ts.AdoptLayer(d, body)
		resp.Body.Close()
		if err != nil {
			return fromPeer(peer, what, err)
		}
	}
	return nil
}

// copySnapshot copies snapshot id from a peer for owner: its description
// (checked: the ID asked for, chunks named by their content with declared
// sizes, see snapshot.CheckManifest; made this node's by localize), its
// template if this node lacks it, then the chunks this node lacks, each
// bounded by its declared size and checked against its name before the
// store uses it.
func (n *Node) copySnapshot(ctx context.Context, peer store.NodeRecord, id, owner string) error {
	if err := snapshot.ValidID(id); err != nil {
		return err
	}
	n.log.Info("fleet: copying snapshot from a peer", "snapshot", id, "from", peer.Name)
	var sn snapshot.Snapshot
	if err := n.peerJSON(ctx, peer, "snapshots/"+id, maxManifest, &sn); err != nil {
		return err
	}
	what := "snapshot " + id
	if err := snapshot.CheckManifest(id, sn); err != nil {
		return fromPeer(peer, what, err)
	}
	sn, err := n.localize(sn, owner)
	if err != nil {
		return fromPeer(peer, what, err)
	}
	// A restore needs the snapshot's template too.
	if sn.Template != "" {
		if err := template.ValidName(sn.Template); err != nil {
			return fromPeer(peer, what, err)
		}
	}
	if err := n.ensure(ctx, sn.Template, owner); err != nil {
		return err
	}
	// And the layers it was taken on, which its template may have left.
	release, err := n.copyLayers(ctx, peer, what, n.host.TemplateStore.Dir(), sn.Lowers)
	if err != nil {
		return err
	}
	defer release()
	_, err = n.host.SnapshotStore.Import(id, sn, func(chunk string, size int64, dst string) error {
		return n.copyChunk(ctx, peer, id, chunk, size, dst)
	})
	if err != nil {
		return fromPeer(peer, what, err)
	}
	return n.publishNow(ctx)
}

// localize makes a peer's description of a snapshot this node's: its
// owner is the one the request is for (a key's request for a snapshot the
// peer says is another's is refused: to that key it does not exist), and
// each volume it mounted is found again by its ID in this node's volume
// store, which gives the host directory to bind and the volume's name;
// the peer's source paths and names are dropped. So nothing a peer sends
// becomes a mount source or an owner.
func (n *Node) localize(sn snapshot.Snapshot, owner string) (snapshot.Snapshot, error) {
	if owner != "" && sn.Owner != owner {
		return snapshot.Snapshot{}, errdefs.NotFound("snapshot %s does not exist", sn.ID)
	}
	sn.Owner = owner
	if len(sn.Volumes) == 0 {
		sn.Volumes = nil
		return sn, nil
	}
	mounts := make([]volume.Mount, 0, len(sn.Volumes))
	for _, m := range sn.Volumes {
		if err := volume.CheckID(m.ID); err != nil {
			return snapshot.Snapshot{}, err
		}
		if err := volume.CheckMountPath(m.Path); err != nil {
			return snapshot.Snapshot{}, err
		}
		if n.host.Volumes == nil {
			return snapshot.Snapshot{}, errdefs.NotFound("snapshot %s mounted volume %s, and this node keeps no volumes: restore it on the volume's node", sn.ID, m.ID)
		}
		v, err := n.host.Volumes.Get(owner, m.ID)
		if err != nil {
			return snapshot.Snapshot{}, errdefs.NotFound("snapshot %s mounted volume %s, which is not on this node: restore it on the volume's node", sn.ID, m.ID)
		}
		src, err := n.host.Volumes.BindSource(v.ID)
		if err != nil {
			return snapshot.Snapshot{}, err
		}
		mounts = append(mounts, volume.Mount{ID: v.ID, Name: v.Name, Path: m.Path, Source: src})
	}
	sn.Volumes = mounts
	return sn, nil
}

// copyChunk downloads one chunk of a snapshot, of the size its
// description declares, into the new file dst, resuming where a broken
// transfer stopped. More bytes than declared fail it at once.
func (n *Node) copyChunk(ctx context.Context, peer store.NodeRecord, id, chunk string, size int64, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	var last error
	for range fetchAttempts {
		off, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			return err
		}
		switch {
		case off == size: // the last attempt broke after the last byte
			return f.Close()
		case off > size: // cannot be: nothing is written past size
			return fmt.Errorf("copying snapshot %s chunk %s: %d bytes, past the declared %d", id, chunk, off, size)
		}
		resp, err := n.peerGet(ctx, peer, "snapshots/"+id+"/files/"+chunk, off, true)
		if err != nil {
			last = err
			continue
		}
		if off > 0 && resp.StatusCode != http.StatusPartialContent {
			// The peer ignored the range: start over.
			f.Truncate(0)
			off = 0
		}
		// Chunks are sparse where their shared pages were punched out:
		// keep them so here too (and, from a peer that can, receive the
		// holes as lengths, not zeros).
		if resp.Header.Get(sparseHeader) == "1" {
			err = snapshot.ReadSparse(f, resp.Body, off, size)
		} else {
			_, err = snapshot.CopySparse(f, &sizedBody{r: resp.Body, left: size - off}, off)
		}
		resp.Body.Close()
		if err == nil {
			return f.Close()
		}
		if errors.Is(err, errPeerData) || errors.Is(err, snapshot.ErrBadStream) {
			return fromPeer(peer, fmt.Sprintf("snapshot %s chunk %s (%d bytes declared)", id, chunk, size), err)
		}
		last = err
	}
	return errdefs.Unavailable("copying snapshot %s chunk %s from node %s: %v", id, chunk, peer.Name, last)
}

// sizedBody passes on exactly left bytes of r: a byte more is errPeerData
// (before it is passed on), an end before is io.ErrUnexpectedEOF.
type sizedBody struct {
	r    io.Reader
	left int64
}

func (b *sizedBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		var one [1]byte
		k, err := b.r.Read(one[:])
		if k > 0 {
			return 0, fmt.Errorf("more bytes than declared: %w", errPeerData)
		}
		return 0, err
	}
	p = p[:min(int64(len(p)), b.left)]
	k, err := b.r.Read(p)
	b.left -= int64(k)
	if errors.Is(err, io.EOF) && b.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return k, err
}

// freeBytes is what the file system holding dir has free for its users.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

func (n *Node) exportTemplateMeta(w http.ResponseWriter, r *http.Request) {
	t, err := n.host.TemplateStore.Get(r.PathValue("name"))
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	f, err := os.Open(n.host.TemplateStore.ImagePath(t.Name))
	if err != nil {
		nodepb.WriteHTTPError(w, errdefs.NotFound("template image: %v", err))
		return
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	t.ImageSize, t.InUse = size, 0 // what the receiver bounds the image by
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(templateCopy{Template: t, SHA256: hex.EncodeToString(h.Sum(nil))})
}

func (n *Node) exportTemplateImage(w http.ResponseWriter, r *http.Request) {
	t, err := n.host.TemplateStore.Get(r.PathValue("name"))
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	serveFile(w, r, n.host.TemplateStore.ImagePath(t.Name))
}

func (n *Node) exportLayer(w http.ResponseWriter, r *http.Request) {
	d := r.PathValue("digest")
	if !template.IsDigest(d) || !n.host.TemplateStore.HasLayer(d) {
		nodepb.WriteHTTPError(w, errdefs.NotFound("no layer %q on this node", d))
		return
	}
	serveFile(w, r, n.host.TemplateStore.LayerPath(d))
}

func (n *Node) exportSnapshotMeta(w http.ResponseWriter, r *http.Request) {
	sn, err := n.host.SnapshotStore.Manifest(r.PathValue("id"))
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(sn)
}

// exportSnapshotFile serves one chunk of a snapshot (the route's {file}).
func (n *Node) exportSnapshotFile(w http.ResponseWriter, r *http.Request) {
	p, err := n.host.SnapshotStore.ChunkPath(r.PathValue("id"), r.PathValue("file"))
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	serveFile(w, r, p)
}

// serveFile serves a file with Range support (a broken copy resumes).
func serveFile(w http.ResponseWriter, r *http.Request, p string) {
	f, err := os.Open(p)
	if err != nil {
		nodepb.WriteHTTPError(w, errdefs.NotFound("snapshot file: %v", err))
		return
	}
	defer f.Close()
	if r.Header.Get(sparseHeader) == "1" {
		serveSparse(w, r, f)
		return
	}
	st, err := f.Stat()
	if err != nil {
		nodepb.WriteHTTPError(w, err)
		return
	}
	http.ServeContent(w, r, "", st.ModTime(), f)
}
