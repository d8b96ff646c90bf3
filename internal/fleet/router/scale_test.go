package router

// The control-plane scale test: one API server, a real (embedded) etcd and
// 100 fake nodes in one process, the runtime faked away, so that what is
// measured is placement, the node RPC, etcd writes and the cache's watch.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/fleettest"
	"github.com/agentenv/agentenv/internal/fleet/node"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

const (
	scaleNodes   = 100
	scaleRecords = 20000
	scaleSecret  = "scale-secret"
	scaleAPIKey  = "k"
)

var scaleSeal = secret.NewSealer(scaleSecret)

func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("scale test: starts etcd, 100 fake nodes and 22,000 sandbox records (~5-10 s on 2 cores); run without -short")
	}
	scaleLeakCheck(t)
	f := newScaleFleet(t, scaleNodes, scaleRecords)

	// A second API server's cache that takes none of the creates: it
	// learns of them only through its watch.
	ctx2, cancel2 := context.WithCancel(context.Background())
	t.Cleanup(cancel2)
	other := store.NewCache(ctx2, f.cli, scaleSeal, scaleLog())
	if err := other.Wait(scaleTimeout(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}

	const places = 2000
	placeLat := f.placeMany(t, places)

	const creates, inflight = 2000, 32
	run := f.createMany(t, creates, inflight)
	if run.failed > 0 {
		t.Fatalf("got %d of %d creates answered other than 201 (first: %s), want all 201", run.failed, creates, run.firstErr)
	}
	if got := len(run.ids); got != creates {
		t.Fatalf("got %d distinct sandbox IDs, want %d", got, creates)
	}
	used, most := f.spread()
	if used < 90 {
		t.Errorf("got the new sandboxes on %d nodes, want ≥ 90 of %d", used, scaleNodes)
	}

	want := scaleRecords + creates
	scaleEventually(t, 30*time.Second, fmt.Sprintf("the serving cache to hold %d records", want), func() bool { return scaleCount(f.cache) == want })
	scaleEventually(t, 30*time.Second, fmt.Sprintf("the other API server's cache to hold %d records", want), func() bool { return scaleCount(other) == want })
	watchLag := time.Since(run.end)

	const lists = 5
	var listLat []time.Duration
	var listBytes int
	for range lists {
		start := time.Now()
		n, size := f.list(t)
		listLat = append(listLat, time.Since(start))
		listBytes = size
		if n != want {
			t.Fatalf("got %d sandboxes listed, want %d", n, want)
		}
	}

	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\ncontrol plane: %d nodes, %d records before, %d after, GOMAXPROCS %d\n", scaleNodes, scaleRecords, want, runtime.GOMAXPROCS(0))
	fmt.Fprintf(tw, "what\tn\tp50\tp99\tmax\tnote\n")
	fmt.Fprintf(tw, "seed records (etcd txns of 128)\t%d\t\t\t\t%.0f records/s\n", scaleRecords, float64(scaleRecords)/f.seedTook.Seconds())
	fmt.Fprintf(tw, "first full read of the cache\t1\t%v\t\t\t\n", f.readTook.Round(time.Millisecond))
	fmt.Fprintf(tw, "placement (remote.place)\t%d\t%v\t%v\t%v\t\n", places, scalePct(placeLat, 50), scalePct(placeLat, 99), scalePct(placeLat, 100))
	fmt.Fprintf(tw, "create, POST /sandboxes\t%d\t%v\t%v\t%v\t%.0f creates/s at %d in flight\n", creates, scalePct(run.lat, 50), scalePct(run.lat, 99), scalePct(run.lat, 100), float64(creates)/run.took.Seconds(), inflight)
	fmt.Fprintf(tw, "  spread\t\t\t\t\t%d nodes used, most on one node: %d, most at once on one node: %d (1 if placement reserved its pick)\n", used, most, f.maxConcurrent())
	fmt.Fprintf(tw, "watch caught up after the last create\t\t\t\t\t%v\n", watchLag.Round(time.Microsecond))
	fmt.Fprintf(tw, "list all, GET /v2/sandboxes in pages of 100\t%d\t%v\t\t%v\t%d records, %.1f MB\n", lists, scalePct(listLat, 50), scalePct(listLat, 100), want, float64(listBytes)/1e6)
	tw.Flush()
	t.Log(b.String())
}

// BenchmarkPlace ranks the 100 nodes of a fleet holding 20,000 sandbox
// records, as each create does.
func BenchmarkPlace(b *testing.B) {
	f := newScaleFleet(b, scaleNodes, scaleRecords)
	var lat []time.Duration
	for b.Loop() {
		start := time.Now()
		order := f.remote.place("busybox", 0, false)
		lat = append(lat, time.Since(start))
		if len(order) != scaleNodes {
			b.Fatalf("got %d nodes placed, want %d", len(order), scaleNodes)
		}
	}
	b.ReportMetric(float64(scalePct(lat, 50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(scalePct(lat, 99).Nanoseconds()), "p99-ns")
}

// scaleFleet is an API server over a real etcd and fake nodes.
type scaleFleet struct {
	cli    *clientv3.Client
	cache  *store.Cache
	remote *Remote
	api    *httptest.Server
	client *http.Client
	nodes  []*scaleNode

	seedTook, readTook time.Duration
}

// newScaleFleet starts etcd, registers nodes fake nodes, seeds records
// sandbox records over them and starts one API server. Everything stops
// in tb.Cleanup.
func newScaleFleet(tb testing.TB, nodes, records int) *scaleFleet {
	tb.Helper()
	f := &scaleFleet{cli: scaleEtcd(tb)}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)

	for i := range nodes {
		f.nodes = append(f.nodes, startScaleNode(tb, ctx, f.cli, fmt.Sprintf("node-%03d", i)))
	}

	start := time.Now()
	var ops []clientv3.Op
	for i := range records {
		n := f.nodes[i%len(f.nodes)]
		sb, val := n.record(fmt.Sprintf("seed-%06d", i), "busybox")
		ops = append(ops, clientv3.OpPut(store.SandboxPrefix+sb.ID, val))
		if len(ops) == 128 || i == records-1 {
			if _, err := f.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				tb.Fatalf("seeding sandbox records: %v", err)
			}
			ops = ops[:0]
		}
	}
	f.seedTook = time.Since(start)

	start = time.Now()
	f.cache = store.NewCache(ctx, f.cli, scaleSeal, scaleLog())
	if err := f.cache.Wait(scaleTimeout(tb, 30*time.Second)); err != nil {
		tb.Fatal(err)
	}
	f.readTook = time.Since(start)
	if got := scaleCount(f.cache); got != records {
		tb.Fatalf("got %d records in the cache after its first read, want %d", got, records)
	}
	if got := len(f.cache.Holders("busybox")); got != nodes {
		tb.Fatalf("got %d nodes holding busybox, want %d", got, nodes)
	}

	f.remote = NewRemote(f.cli, f.cache, scaleSecret, nil, scaleLog())
	tb.Cleanup(f.remote.http.CloseIdleConnections)
	f.api = httptest.NewServer(api.New(api.Config{APIKey: scaleAPIKey, Backend: f.remote, Fleet: f.remote, Log: scaleLog()}).Handler())
	tb.Cleanup(f.api.Close)
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	tb.Cleanup(f.client.CloseIdleConnections)
	return f
}

// placeMany times n placements, one at a time.
func (f *scaleFleet) placeMany(tb testing.TB, n int) []time.Duration {
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		order := f.remote.place("busybox", 0, false)
		lat = append(lat, time.Since(start))
		if len(order) != len(f.nodes) {
			tb.Fatalf("got %d nodes placed, want %d", len(order), len(f.nodes))
		}
	}
	return lat
}

type scaleRun struct {
	lat      []time.Duration
	took     time.Duration
	end      time.Time // when the last create was answered
	ids      map[string]bool
	failed   int
	firstErr string
}

// createMany posts n creates to the API server, inflight at a time.
func (f *scaleFleet) createMany(tb testing.TB, n, inflight int) scaleRun {
	run := scaleRun{ids: map[string]bool{}}
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				id, err := f.create()
				d := time.Since(t0)
				mu.Lock()
				run.lat = append(run.lat, d)
				if err != nil {
					if run.failed++; run.failed == 1 {
						run.firstErr = err.Error()
					}
				} else {
					run.ids[id] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	run.end = time.Now()
	run.took = run.end.Sub(start)
	return run
}

func (f *scaleFleet) create() (string, error) {
	req, err := http.NewRequest(http.MethodPost, f.api.URL+"/sandboxes", strings.NewReader(`{"templateID":"busybox"}`))
	if err != nil {
		return "", err
	}
	req.Header.Set("X-API-Key", scaleAPIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(body, &sb); err != nil || sb.SandboxID == "" {
		return "", fmt.Errorf("201 without a sandbox ID: %s", body)
	}
	return sb.SandboxID, nil
}

// list lists every sandbox through the API, page by page; it returns how
// many and the size of the answers.
func (f *scaleFleet) list(tb testing.TB) (int, int) {
	tb.Helper()
	n, size, tok := 0, 0, ""
	for {
		u := f.api.URL + "/v2/sandboxes?limit=100"
		if tok != "" {
			u += "&nextToken=" + url.QueryEscape(tok)
		}
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			tb.Fatal(err)
		}
		req.Header.Set("X-API-Key", scaleAPIKey)
		resp, err := f.client.Do(req)
		if err != nil {
			tb.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			tb.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			tb.Fatalf("GET /v2/sandboxes: got HTTP %d (%s), want 200", resp.StatusCode, bytes.TrimSpace(body))
		}
		var out []struct {
			SandboxID string `json:"sandboxID"`
		}
		if err := json.Unmarshal(body, &out); err != nil {
			tb.Fatalf("GET /v2/sandboxes: %v", err)
		}
		n, size = n+len(out), size+len(body)
		if tok = resp.Header.Get("X-Next-Token"); tok == "" {
			return n, size
		}
	}
}

// spread returns how many nodes took creates, and the most one took.
func (f *scaleFleet) spread() (used, most int) {
	for _, n := range f.nodes {
		c := int(n.creates.Load())
		if c > 0 {
			used++
		}
		most = max(most, c)
	}
	return used, most
}

// maxConcurrent is the most creates one node was running at once.
func (f *scaleFleet) maxConcurrent() int {
	most := 0
	for _, n := range f.nodes {
		most = max(most, int(n.peak.Load()))
	}
	return most
}

// scaleNode is a fake node: the node RPC over a Backend whose creates
// only write the sandbox's record to etcd, as a real node does before it
// answers.
type scaleNode struct {
	name string
	cli  *clientv3.Client
	srv  *httptest.Server

	seq     atomic.Int64
	creates atomic.Int64
	running atomic.Int64 // creates in progress
	peak    atomic.Int64 // most creates in progress at once
}

var _ service.Backend = (*scaleNode)(nil)

// startScaleNode serves a fake node and registers it, with its busybox
// template, under a lease kept alive until ctx ends.
func startScaleNode(tb testing.TB, ctx context.Context, cli *clientv3.Client, name string) *scaleNode {
	tb.Helper()
	n := &scaleNode{name: name, cli: cli}
	mux := http.NewServeMux()
	path, svc := node.ServiceHandler(n)
	mux.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if secret.NewVerifier(scaleSecret).Verify(r) != nil {
			nodepb.WriteHTTPError(w, fmt.Errorf("fake node %s: wrong cluster secret: %w", name, errdefs.ErrUnauthenticated))
			return
		}
		svc.ServeHTTP(w, r)
	}))
	n.srv = httptest.NewServer(mux)
	tb.Cleanup(n.srv.Close)

	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		tb.Fatalf("node %s: lease: %v", name, err)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		tb.Fatalf("node %s: keepalive: %v", name, err)
	}
	go func() {
		for range ka {
		}
	}()
	rec, _ := scaleSeal.Seal(store.NodesPrefix+name, store.NodeRecord{
		Name: name, Addr: strings.TrimPrefix(n.srv.URL, "http://"), Runtime: "fake", StartedAt: time.Now().UTC(),
		Capacity: store.Capacity{CPUs: 2, MemoryMB: 32768, FreeMemoryMB: 20000, MaxSandboxes: 500, Templates: 1},
	})
	tmpl, _ := scaleSeal.Seal(store.TemplatePrefix+"busybox/"+name, service.TemplateInfo{Template: template.Template{
		Name: "busybox", Source: "docker.io/library/busybox:latest", CreatedAt: time.Now().UTC(), ImageSize: 4 << 20, EnvdHash: "fake",
	}, Ready: true})
	_, err = cli.Txn(ctx).Then(
		clientv3.OpPut(store.NodesPrefix+name, rec, clientv3.WithLease(lease.ID)),
		clientv3.OpPut(store.TemplatePrefix+"busybox/"+name, tmpl, clientv3.WithLease(lease.ID)),
	).Commit()
	if err != nil {
		tb.Fatalf("node %s: registering: %v", name, err)
	}
	return n
}

// record returns a running sandbox on n and its sealed record.
func (n *scaleNode) record(id, tmpl string) (sandbox.Sandbox, string) {
	now := time.Now().UTC()
	sb := sandbox.Sandbox{
		ID: id, Template: tmpl, State: sandbox.StateRunning, CPUs: 2, MemoryMB: 512,
		StartedAt: now, EndAt: now.Add(5 * time.Minute),
		AccessToken: fmt.Sprintf("%032x", n.seq.Add(1)),
		Metadata:    map[string]string{"user": "scale"},
		Network:     sandbox.Network{AllowInternet: true},
	}
	val, _ := scaleSeal.Seal(store.SandboxPrefix+id, store.RecordOf(n.name, sb))
	return sb, val
}

func (n *scaleNode) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	now := n.running.Add(1)
	defer n.running.Add(-1)
	for {
		p := n.peak.Load()
		if now <= p || n.peak.CompareAndSwap(p, now) {
			break
		}
	}
	if req.Template != "busybox" {
		return sandbox.Sandbox{}, errdefs.NotFound("template %q does not exist on fake node %s", req.Template, n.name)
	}
	id := fmt.Sprintf("%s-%06d", n.name, n.seq.Add(1))
	sb, val := n.record(id, req.Template)
	if _, err := n.cli.Put(ctx, store.SandboxPrefix+id, val); err != nil {
		return sandbox.Sandbox{}, errdefs.Unavailable("recording sandbox %s in etcd: %v", id, err)
	}
	n.creates.Add(1)
	return sb, nil
}

func (n *scaleNode) notFound(id string) error {
	return errdefs.NotFound("fake node %s does not run sandbox %q", n.name, id)
}

func (n *scaleNode) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	return nil, nil
}

func (n *scaleNode) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) Kill(ctx context.Context, id string) error { return n.notFound(id) }

func (n *scaleNode) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) SetNetwork(ctx context.Context, id string, nw sandbox.Network) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, n.notFound(id)
}

func (n *scaleNode) Connect(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, bool, error) {
	return sandbox.Sandbox{}, false, n.notFound(id)
}

func (n *scaleNode) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	return snapshot.Snapshot{}, n.notFound(id)
}

func (n *scaleNode) Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error) {
	return nil, n.notFound(id)
}

func (n *scaleNode) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	return nil, nil
}

func (n *scaleNode) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	return snapshot.Snapshot{}, errdefs.NotFound("fake node %s has no snapshot %q", n.name, id)
}

func (n *scaleNode) DeleteSnapshot(ctx context.Context, id string) error {
	return errdefs.NotFound("fake node %s has no snapshot %q", n.name, id)
}

func (n *scaleNode) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	return sandbox.Metric{}, errdefs.Unavailable("fake node %s samples no metrics", n.name)
}

func (n *scaleNode) ListTemplates(ctx context.Context) ([]service.TemplateInfo, error) {
	return nil, nil
}

func (n *scaleNode) GetTemplate(ctx context.Context, name string) (service.TemplateInfo, error) {
	return service.TemplateInfo{}, errdefs.NotFound("fake node %s has no template %q", n.name, name)
}

func (n *scaleNode) DeleteTemplate(ctx context.Context, name string) error {
	return errdefs.NotFound("fake node %s has no template %q", n.name, name)
}

// The fake node holds no volumes (the scale test makes none).
func (n *scaleNode) CreateVolume(ctx context.Context, owner, name string) (service.VolumeInfo, error) {
	return service.VolumeInfo{}, errdefs.Invalid("fake node %s holds no volumes", n.name)
}

func (n *scaleNode) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	return nil, nil
}

func (n *scaleNode) GetVolume(ctx context.Context, owner, id string) (service.VolumeInfo, error) {
	return service.VolumeInfo{}, errdefs.NotFound("fake node %s has no volume %s", n.name, id)
}

func (n *scaleNode) VolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	return volume.Volume{}, errdefs.NotFound("fake node %s has no volume '%s'", n.name, name)
}

func (n *scaleNode) DeleteVolume(ctx context.Context, owner, id string) error {
	return errdefs.NotFound("fake node %s has no volume %s", n.name, id)
}

func (n *scaleNode) VolumeContent(w http.ResponseWriter, r *http.Request, id string) {
	service.WriteContentError(w, errdefs.NotFound("fake node %s has no volume %s", n.name, id))
}

func (n *scaleNode) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	return service.TemplateInfo{}, errdefs.Invalid("fake node %s does not build templates", n.name)
}

func scaleEtcd(tb testing.TB) *clientv3.Client { return fleettest.Etcd(tb) }

// scaleCount is how many sandbox records a cache holds.
func scaleCount(c *store.Cache) int { return c.Len() }

// scaleLog drops the fleet's logs (node up × 100): a goroutine may still
// log after the test has ended.
func scaleLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// scaleTimeout is a context that ends after d or with the test.
func scaleTimeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// scaleEventually polls cond until it holds or the deadline passes.
func scaleEventually(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("gave up after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scalePct returns the p-th percentile (nearest rank) of lat.
func scalePct(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)].Round(time.Microsecond)
}

// scaleLeakCheck fails the test if, once every cleanup has run, clearly
// more goroutines run than before it started (etcd and net/http wind
// down asynchronously: the check is loose).
func scaleLeakCheck(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		const slack = 10
		deadline := time.Now().Add(30 * time.Second)
		for runtime.NumGoroutine() > before+slack {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("got %d goroutines after the test, want at most %d; stacks:\n%s", runtime.NumGoroutine(), before+slack, buf)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
