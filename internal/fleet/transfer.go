package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"agentenv/internal/errdefs"
	"agentenv/internal/snapshot"
	"agentenv/internal/template"
)

// Data moves between nodes on demand: a create on a node that lacks its
// template or snapshot first copies it from a node that has it. Templates
// travel as a tar of their root filesystem (the receiver builds it like an
// upload); snapshots as their description (each file's extents) plus the
// chunks the receiver lacks, each checked against its content-addressed
// name and resumed with a Range request when a transfer breaks.

// fetchAttempts bounds the resumptions of one file transfer.
const fetchAttempts = 4

// ensure makes name (a template or snapshot, "" for the default) present
// on this node, copying it from a peer if it is not.
func (n *Node) ensure(ctx context.Context, name string) error {
	if name == "" || n.host.Snapshots.Has(name) {
		return nil
	}
	if _, err := n.host.Templates.Get(name); err == nil {
		return nil
	}
	// One copy per name, whoever asks; a caller that gives up stops
	// waiting (the copy goes on for the others).
	ch := n.fetch.DoChan(name, func() (any, error) { return nil, n.copyIn(context.WithoutCancel(ctx), name) })
	select {
	case res := <-ch:
		return res.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// copyIn copies name from a live peer that holds it.
func (n *Node) copyIn(ctx context.Context, name string) error {
	for _, kind := range []string{snapPrefix, templatePrefix} {
		peer, ok, err := n.peerHolding(ctx, kind, name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if kind == snapPrefix {
			return n.copySnapshot(ctx, peer, name)
		}
		return n.copyTemplate(ctx, peer, name)
	}
	return nil // not anywhere: the create says it does not exist
}

// peerHolding finds a live node other than this one under kind/name/.
func (n *Node) peerHolding(ctx context.Context, kind, name string) (NodeRecord, bool, error) {
	resp, err := n.cli.Get(ctx, kind+name+"/", clientv3.WithPrefix())
	if err != nil {
		return NodeRecord{}, false, errdefs.Unavailable("etcd: %v", err)
	}
	for _, kv := range resp.Kvs {
		peer := strings.TrimPrefix(string(kv.Key), kind+name+"/")
		if peer == n.cfg.Name {
			continue
		}
		nr, err := n.cli.Get(ctx, nodesPrefix+peer)
		if err != nil || len(nr.Kvs) == 0 {
			continue
		}
		var rec NodeRecord
		if json.Unmarshal(nr.Kvs[0].Value, &rec) == nil {
			return rec, true, nil
		}
	}
	return NodeRecord{}, false, nil
}

// peerGet asks a peer for path from offset; with sparse, it asks for the
// sparse encoding (sparse.go), which the answer may or may not use.
func (n *Node) peerGet(ctx context.Context, peer NodeRecord, path string, offset int64, sparse bool) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer.base()+rpcPath+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(SecretHeader, n.cfg.Secret)
	if sparse {
		req.Header.Set(sparseHeader, "1")
	}
	if offset > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
	}
	resp, err := n.http.Do(req)
	if err != nil {
		return nil, errdefs.Unavailable("copying from node %s: %v", peer.Name, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		defer resp.Body.Close()
		return nil, readWireError(resp)
	}
	return resp, nil
}

// templateCopy is a template's metadata as a peer sends it, with the
// SHA-256 of its image.
type templateCopy struct {
	Template template.Template `json:"template"`
	SHA256   string            `json:"sha256"`
}

// copyTemplate copies a template's EROFS image byte for byte (a rebuild
// would differ, and snapshots restore only onto the image they were taken
// on), then makes it ready in the background.
func (n *Node) copyTemplate(ctx context.Context, peer NodeRecord, name string) error {
	n.log.Info("fleet: copying template from a peer", "template", name, "from", peer.Name)
	resp, err := n.peerGet(ctx, peer, "templates/"+name, 0, false)
	if err != nil {
		return err
	}
	var tc templateCopy
	err = json.NewDecoder(resp.Body).Decode(&tc)
	resp.Body.Close()
	if err != nil {
		return errdefs.Unavailable("template %s metadata from node %s: %v", name, peer.Name, err)
	}
	resp, err = n.peerGet(ctx, peer, "templates/"+name+"/image", 0, false)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := n.host.Templates.Adopt(ctx, tc.Template, resp.Body, tc.SHA256); err != nil {
		return fmt.Errorf("copying template %s from node %s: %w", name, peer.Name, err)
	}
	go func() {
		if err := n.host.Manager.MakeReady(context.WithoutCancel(ctx), name, false); err != nil {
			n.log.Warn("fleet: copied template not ready; its sandboxes boot", "template", name, "err", err)
		}
	}()
	return n.publishNow(ctx)
}

func (n *Node) copySnapshot(ctx context.Context, peer NodeRecord, id string) error {
	n.log.Info("fleet: copying snapshot from a peer", "snapshot", id, "from", peer.Name)
	resp, err := n.peerGet(ctx, peer, "snapshots/"+id, 0, false)
	if err != nil {
		return err
	}
	var sn snapshot.Snapshot
	err = json.NewDecoder(resp.Body).Decode(&sn)
	resp.Body.Close()
	if err != nil {
		return errdefs.Unavailable("snapshot %s metadata from node %s: %v", id, peer.Name, err)
	}
	// A restore needs the snapshot's template too.
	if err := n.ensure(ctx, sn.Template); err != nil {
		return err
	}
	// Only the chunks this node lacks travel; the store checks each
	// against its name (content addressed) before using it.
	_, err = n.host.Snapshots.Import(sn, func(chunk, dst string) error {
		return n.copyChunk(ctx, peer, id, chunk, dst)
	})
	if err != nil {
		return fmt.Errorf("storing snapshot %s copied from node %s: %w", id, peer.Name, err)
	}
	return n.publishNow(ctx)
}

// copyChunk downloads one chunk of a snapshot, resuming where a broken
// transfer stopped.
func (n *Node) copyChunk(ctx context.Context, peer NodeRecord, id, chunk, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o600)
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
			err = readSparse(f, resp.Body, off)
		} else {
			_, err = snapshot.CopySparse(f, resp.Body, off)
		}
		resp.Body.Close()
		if err == nil {
			return f.Close()
		}
		last = err
	}
	return errdefs.Unavailable("copying snapshot %s chunk %s from node %s: %v", id, chunk, peer.Name, last)
}

func (n *Node) exportTemplateMeta(w http.ResponseWriter, r *http.Request) {
	t, err := n.host.Templates.Get(r.PathValue("name"))
	if err != nil {
		writeWireError(w, err)
		return
	}
	f, err := os.Open(n.host.Templates.ImagePath(t.Name))
	if err != nil {
		writeWireError(w, errdefs.NotFound("template image: %v", err))
		return
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		writeWireError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(templateCopy{Template: t, SHA256: hex.EncodeToString(h.Sum(nil))})
}

func (n *Node) exportTemplateImage(w http.ResponseWriter, r *http.Request) {
	t, err := n.host.Templates.Get(r.PathValue("name"))
	if err != nil {
		writeWireError(w, err)
		return
	}
	serveFile(w, r, n.host.Templates.ImagePath(t.Name))
}

func (n *Node) exportSnapshotMeta(w http.ResponseWriter, r *http.Request) {
	sn, err := n.host.Snapshots.Get(r.PathValue("id"))
	if err != nil {
		writeWireError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(sn)
}

// exportSnapshotFile serves one chunk of a snapshot (the route's {file}).
func (n *Node) exportSnapshotFile(w http.ResponseWriter, r *http.Request) {
	p, err := n.host.Snapshots.ChunkPath(r.PathValue("id"), r.PathValue("file"))
	if err != nil {
		writeWireError(w, err)
		return
	}
	serveFile(w, r, p)
}

// serveFile serves a file with Range support (a broken copy resumes).
func serveFile(w http.ResponseWriter, r *http.Request, p string) {
	f, err := os.Open(p)
	if err != nil {
		writeWireError(w, errdefs.NotFound("snapshot file: %v", err))
		return
	}
	defer f.Close()
	if r.Header.Get(sparseHeader) == "1" {
		serveSparse(w, r, f)
		return
	}
	st, err := f.Stat()
	if err != nil {
		writeWireError(w, err)
		return
	}
	http.ServeContent(w, r, "", st.ModTime(), f)
}
