package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// fakePeer answers the node export routes (node.go) with what its fields
// say: honest answers by default, lies where a test sets them.
type fakePeer struct {
	src *snapshot.Store

	mu       sync.Mutex
	manifest func(id string) any                                             // nil: the store's
	chunk    func(w http.ResponseWriter, r *http.Request, p string, n int64) // nil: serveFile
	tmpl     any
	image    []byte
	layers   map[string][]byte // digest → bytes served for it
	asked    map[string]int    // path → requests
}

func (p *fakePeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.asked[r.URL.Path]++
	manifest, chunk, tmpl, image, layers := p.manifest, p.chunk, p.tmpl, p.image, p.layers
	p.mu.Unlock()
	path := strings.TrimPrefix(r.URL.Path, nodepb.HTTPPath)
	switch parts := strings.Split(path, "/"); {
	case len(parts) == 2 && parts[0] == "snapshots":
		var v any
		if manifest != nil {
			v = manifest(parts[1])
		} else if sn, err := p.src.Manifest(parts[1]); err == nil {
			v = sn
		} else {
			nodepb.WriteHTTPError(w, err)
			return
		}
		json.NewEncoder(w).Encode(v)
	case len(parts) == 4 && parts[0] == "snapshots" && parts[2] == "files":
		// The real chunk whatever ID the answer named (the lie is in
		// the description, not in the file).
		for _, sn := range p.src.ListAll() {
			if c, err := p.src.ChunkPath(sn.ID, parts[3]); err == nil {
				st, _ := os.Stat(c)
				if chunk != nil {
					chunk(w, r, c, st.Size())
				} else {
					serveFile(w, r, c)
				}
				return
			}
		}
		nodepb.WriteHTTPError(w, errdefs.NotFound("no chunk %s", parts[3]))
	case len(parts) == 2 && parts[0] == "templates":
		json.NewEncoder(w).Encode(tmpl)
	case len(parts) == 3 && parts[0] == "templates" && parts[2] == "image":
		w.Write(image)
	case len(parts) == 2 && parts[0] == "layers":
		b, ok := layers[parts[1]]
		if !ok {
			nodepb.WriteHTTPError(w, errdefs.NotFound("no layer %s", parts[1]))
			return
		}
		w.Write(b)
	default:
		http.NotFound(w, r)
	}
}

func (p *fakePeer) requests(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.asked[nodepb.HTTPPath+path]
}

// peerSetup is a node (stores under root/data, built just enough to copy
// from peers) and a fake peer holding two snapshots of other sandboxes.
type peerSetup struct {
	root  string
	node  *Node
	peer  *fakePeer
	rec   store.NodeRecord
	snaps []snapshot.Snapshot // manifests of the peer's snapshots
}

func newPeerSetup(t *testing.T) *peerSetup {
	t.Helper()
	root := t.TempDir()
	src, err := snapshot.Open(filepath.Join(t.TempDir(), "peer"))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var snaps []snapshot.Snapshot
	for i := range 2 {
		dir, _ := src.TempDir()
		pages := make([]byte, 16*snapshot.PageSize)
		for j := range pages {
			pages[j] = byte(rng.Uint32())
		}
		os.WriteFile(filepath.Join(dir, "pages.img"), pages, 0o600)
		os.WriteFile(filepath.Join(dir, "checkpoint.img"), bytes.Repeat([]byte{byte(i + 1)}, 64<<10), 0o600)
		sn, err := src.Add(dir, snapshot.Snapshot{Sandbox: "sb-" + string(rune('a'+i)), Template: "busybox"})
		if err != nil {
			t.Fatal(err)
		}
		m, err := src.Manifest(sn.ID)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, m)
	}
	envd := filepath.Join(t.TempDir(), "envd")
	os.WriteFile(envd, []byte("envd"), 0o700)
	tmpls, err := template.Open(filepath.Join(root, "data", "templates"), envd, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpls.Adopt(context.Background(), template.Template{Name: "busybox"}, strings.NewReader("image"), ""); err != nil {
		t.Fatal(err)
	}
	snaps0, err := snapshot.Open(filepath.Join(root, "data", "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	n := New(Config{Name: "self", Secret: "s3cret-s3cret-s3cret", Log: slog.Default()})
	n.host = &service.Local{SnapshotStore: snaps0, TemplateStore: tmpls}
	peer := &fakePeer{src: src, asked: map[string]int{}}
	srv := httptest.NewServer(peer)
	t.Cleanup(srv.Close)
	return &peerSetup{root: root, node: n, peer: peer, snaps: snaps,
		rec: store.NodeRecord{Name: "evil", Addr: strings.TrimPrefix(srv.URL, "http://")}}
}

// sparseFrame is one frame of the sparse encoding (snapshot.WriteSparse):
// a kind, a big-endian length and the data.
func sparseFrame(kind byte, n int64, data []byte) []byte {
	return append(binary.BigEndian.AppendUint64([]byte{kind}, uint64(n)), data...)
}

// files lists every file under root with its content's hash.
func files(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		sum := sha256.Sum256(b)
		out[p] = hex.EncodeToString(sum[:])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A node copying a snapshot from a peer that lies about it refuses the
// copy, stores nothing (inside its data dir or outside), leaves the
// snapshot it holds as it was, and says which peer sent what.
func TestCopySnapshotFromLyingPeer(t *testing.T) {
	ps := newPeerSetup(t)
	ctx := context.Background()
	held, want := ps.snaps[0], ps.snaps[1]
	if err := ps.node.copySnapshot(ctx, ps.rec, held.ID, ""); err != nil {
		t.Fatalf("copy from an honest peer: %v", err)
	}
	heldMeta, _ := ps.node.host.SnapshotStore.Get(held.ID)
	var pagesChunk string
	for _, e := range want.Files["pages.img"].Extents {
		pagesChunk = e.Chunk
	}
	chunkPath := "snapshots/" + want.ID + "/files/" + pagesChunk
	outside := filepath.Join(ps.root, "pwned")
	lie := func(f func(sn *snapshot.Snapshot)) func(string) any {
		return func(string) any {
			sn := want
			sn.Files, sn.Chunks = maps.Clone(want.Files), maps.Clone(want.Chunks)
			f(&sn)
			return sn
		}
	}
	frames := func(f func(w http.ResponseWriter, data []byte)) func(http.ResponseWriter, *http.Request, string, int64) {
		return func(w http.ResponseWriter, r *http.Request, p string, _ int64) {
			data, _ := os.ReadFile(p)
			w.Header().Set(sparseHeader, "1")
			f(w, data)
		}
	}
	for _, tc := range []struct {
		name     string
		ask      string
		manifest func(string) any
		chunk    func(http.ResponseWriter, *http.Request, string, int64)
		class    error
		once     bool // the lying chunk is asked for once: no retry
	}{
		{name: "traversal ID", ask: want.ID, manifest: lie(func(sn *snapshot.Snapshot) { sn.ID = "../../../../../../../../" + outside }), class: errdefs.ErrUnavailable},
		{name: "another valid ID", ask: want.ID, manifest: lie(func(sn *snapshot.Snapshot) { sn.ID = snapshot.NewID() }), class: errdefs.ErrUnavailable},
		{name: "the held snapshot's ID", ask: want.ID, manifest: lie(func(sn *snapshot.Snapshot) { sn.ID = held.ID }), class: errdefs.ErrUnavailable},
		{name: "held snapshot, other description", ask: held.ID, manifest: lie(func(sn *snapshot.Snapshot) { sn.ID = held.ID }), class: errdefs.ErrConflict},
		{name: "u- chunk", ask: want.ID, manifest: lie(func(sn *snapshot.Snapshot) {
			f := sn.Files["pages.img"]
			f.Extents = []snapshot.Extent{{Chunk: "u-0123456789abcdef-pages.img", Len: f.Size}}
			sn.Files["pages.img"] = f
			sn.Chunks["u-0123456789abcdef-pages.img"] = f.Size
		}), class: errdefs.ErrUnavailable},
		{name: "template name with a path", ask: want.ID, manifest: lie(func(sn *snapshot.Snapshot) { sn.Template = "../x" }), class: errdefs.ErrUnavailable},
		{name: "chunk bytes differ", ask: want.ID, chunk: func(w http.ResponseWriter, r *http.Request, p string, _ int64) {
			data, _ := os.ReadFile(p)
			data[0] ^= 1
			w.Write(data)
		}, class: errdefs.ErrUnavailable},
		{name: "giant hole frame", ask: want.ID, once: true, chunk: frames(func(w http.ResponseWriter, data []byte) {
			w.Write(sparseFrame('z', 1<<40, nil))
		}), class: errdefs.ErrUnavailable},
		{name: "more sparse data than declared", ask: want.ID, once: true, chunk: frames(func(w http.ResponseWriter, data []byte) {
			more := append(data, make([]byte, snapshot.PageSize)...)
			more[len(more)-1] = 1
			w.Write(sparseFrame('d', int64(len(more)), more))
		}), class: errdefs.ErrUnavailable},
		{name: "more plain data than declared", ask: want.ID, once: true, chunk: func(w http.ResponseWriter, r *http.Request, p string, _ int64) {
			data, _ := os.ReadFile(p)
			w.Write(append(data, 1))
		}, class: errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps.peer.mu.Lock()
			ps.peer.manifest, ps.peer.chunk, ps.peer.asked = tc.manifest, tc.chunk, map[string]int{}
			ps.peer.mu.Unlock()
			before := files(t, ps.root)
			err := ps.node.copySnapshot(ctx, ps.rec, tc.ask, "")
			if !errors.Is(err, tc.class) {
				t.Fatalf("copy: got %v, want an error of class %v", err, tc.class)
			}
			if !strings.Contains(err.Error(), "node evil") {
				t.Errorf("error %q does not say which node sent it", err)
			}
			if after := files(t, ps.root); !maps.Equal(after, before) {
				t.Errorf("a refused copy changed files under %s:\nbefore %v\nafter  %v", ps.root, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
			}
			if tc.ask != held.ID && ps.node.host.SnapshotStore.Has(tc.ask) {
				t.Errorf("a refused copy left snapshot %s", tc.ask)
			}
			if got, _ := ps.node.host.SnapshotStore.Get(held.ID); got.CreatedAt != heldMeta.CreatedAt || !maps.EqualFunc(got.Files, heldMeta.Files, func(a, b snapshot.File) bool { return slices.Equal(a.Extents, b.Extents) }) {
				t.Errorf("held snapshot changed: %+v, want %+v", got, heldMeta)
			}
			if n := ps.peer.requests(chunkPath); tc.once && n != 1 {
				t.Errorf("the lying chunk was asked for %d times, want 1 (a lie is not retried)", n)
			}
		})
	}
	ps.peer.mu.Lock()
	ps.peer.manifest, ps.peer.chunk = nil, nil
	ps.peer.mu.Unlock()
	if err := ps.node.copySnapshot(ctx, ps.rec, want.ID, ""); err != nil {
		t.Fatalf("copy from the peer once honest: %v", err)
	}
}

// A template copied from a peer is the one asked for, with its image's
// SHA-256 and exact size; a lie stores nothing.
func TestCopyTemplateFromLyingPeer(t *testing.T) {
	ps := newPeerSetup(t)
	image := []byte("an EROFS image, byte for byte")
	sum := sha256.Sum256(image)
	honest := templateCopy{Template: template.Template{Name: "alpine", ImageSize: int64(len(image))}, SHA256: hex.EncodeToString(sum[:])}
	for _, tc := range []struct {
		name      string
		ask       string
		lie       func(tc *templateCopy)
		image     []byte
		class     error
		noRequest bool // refused before the image is asked for
	}{
		{name: "another name", ask: "alpine", lie: func(tc *templateCopy) { tc.Template.Name = "busybox" }, class: errdefs.ErrUnavailable, noRequest: true},
		{name: "a path for a name", ask: "alpine", lie: func(tc *templateCopy) { tc.Template.Name = "../../pwned" }, class: errdefs.ErrUnavailable, noRequest: true},
		{name: "no SHA-256", ask: "alpine", lie: func(tc *templateCopy) { tc.SHA256 = "" }, class: errdefs.ErrUnavailable, noRequest: true},
		{name: "no size", ask: "alpine", lie: func(tc *templateCopy) { tc.Template.ImageSize = 0 }, class: errdefs.ErrUnavailable, noRequest: true},
		{name: "more than the disk", ask: "alpine", lie: func(tc *templateCopy) { tc.Template.ImageSize = 1 << 60 }, class: errdefs.ErrResourceExhausted, noRequest: true},
		{name: "longer image than declared", ask: "alpine", image: append(slices.Clone(image), '!'), class: errdefs.ErrUnavailable},
		{name: "shorter image than declared", ask: "alpine", image: image[:10], class: errdefs.ErrUnavailable},
		{name: "image of another hash", ask: "alpine", image: bytes.ToUpper(image), class: errdefs.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tcopy := honest
			if tc.lie != nil {
				tc.lie(&tcopy)
			}
			img := image
			if tc.image != nil {
				img = tc.image
			}
			ps.peer.mu.Lock()
			ps.peer.tmpl, ps.peer.image, ps.peer.asked = tcopy, img, map[string]int{}
			ps.peer.mu.Unlock()
			before := files(t, ps.root)
			err := ps.node.copyTemplate(context.Background(), ps.rec, tc.ask)
			if !errors.Is(err, tc.class) {
				t.Fatalf("copy: got %v, want an error of class %v", err, tc.class)
			}
			if !strings.Contains(err.Error(), "node evil") {
				t.Errorf("error %q does not say which node sent it", err)
			}
			if after := files(t, ps.root); !maps.Equal(after, before) {
				t.Errorf("a refused copy changed files under %s:\nbefore %v\nafter  %v", ps.root, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
			}
			if _, err := ps.node.host.TemplateStore.Get(tc.ask); err == nil {
				t.Errorf("a refused copy left template %s", tc.ask)
			}
			if n := ps.peer.requests("templates/" + tc.ask + "/image"); tc.noRequest && n != 0 {
				t.Errorf("the image was asked for %d times after a description that should be refused", n)
			}
		})
	}
}

// A node copying a layered template asks only for the layers it lacks,
// checks each against its digest, and keeps nothing of a lying one.
func TestCopyTemplateLayers(t *testing.T) {
	ps := newPeerSetup(t)
	ts := ps.node.host.TemplateStore
	digest := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	base, mid := []byte("the base layer"), []byte("a middle layer")
	db, dm := digest(base), digest(mid)
	if err := ts.AdoptLayer(db, bytes.NewReader(base)); err != nil {
		t.Fatal(err)
	}
	ps.peer.mu.Lock()
	ps.peer.layers = map[string][]byte{db: base, dm: mid}
	ps.peer.mu.Unlock()
	dir := filepath.Dir(filepath.Dir(ts.ImagePath("x")))
	release, err := ps.node.copyLayers(context.Background(), ps.rec, "template x", dir, []string{dm, db})
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// Until the template stacks on them, the copy holds them: the store's
	// sweep, which removes layers nothing uses, keeps both.
	ts.SweepRetired()
	if !ts.HasLayer(dm) || !ts.HasLayer(db) {
		t.Fatalf("the sweep removed a layer the copy holds (middle %v, base %v)", ts.HasLayer(dm), ts.HasLayer(db))
	}
	if n := ps.peer.requests("layers/" + db); n != 0 {
		t.Errorf("the layer the node had was asked for %d times", n)
	}
	if n := ps.peer.requests("layers/" + dm); n != 1 {
		t.Errorf("the missing layer was asked for %d times, want once", n)
	}
	if b, err := os.ReadFile(ts.LayerPath(dm)); err != nil || !bytes.Equal(b, mid) {
		t.Errorf("copied layer: %q, %v", b, err)
	}
	// The template on them adopts; one on a layer not here is refused.
	image := []byte("the top image")
	if _, err := ts.Adopt(context.Background(), template.Template{Name: "x", Lowers: []string{dm, db}}, bytes.NewReader(image), digest(image)); err != nil {
		t.Fatalf("adopt on copied layers: %v", err)
	}
	if _, err := ts.Adopt(context.Background(), template.Template{Name: "y", Lowers: []string{digest([]byte("absent"))}}, bytes.NewReader(image), ""); err == nil {
		t.Error("adopted a template whose layer is not here")
	}

	// A peer sending other bytes for a digest, or a name for a digest.
	lie := digest([]byte("promised"))
	ps.peer.mu.Lock()
	ps.peer.layers[lie] = []byte("something else")
	ps.peer.mu.Unlock()
	before := files(t, ps.root)
	_, err = ps.node.copyLayers(context.Background(), ps.rec, "template z", dir, []string{lie})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "node evil") {
		t.Errorf("a layer of another hash: %v, want unavailable naming the peer", err)
	}
	if _, err := ps.node.copyLayers(context.Background(), ps.rec, "template z", dir, []string{"../../etc/passwd"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a path for a digest: %v, want unavailable", err)
	}
	if after := files(t, ps.root); !maps.Equal(after, before) {
		t.Errorf("refused layers changed files:\nbefore %v\nafter  %v", slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
	}
	if ts.HasLayer(lie) {
		t.Error("the lying layer was kept")
	}
}
