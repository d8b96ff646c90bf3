package server_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentenv/agentenv/client"
	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/imagebuild/imagebuildtest"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// thinFS is the size of TestDiskThin's data filesystem: with 2 GiB write
// layers charged at their size (as before), it holds two sandboxes.
const thinFS = 6 << 30

// TestDiskThin: with the CLI's default disk settings (a 2 GiB reserve, no
// budget) and the default 2 GiB write layers, on a 6 GiB data filesystem:
// 64 creates at once and a fork of 64 all succeed (layers count as used);
// an upload, a gzip bomb in a COPY step or as an image layer, and a RUN
// step that would pass the reserve are stopped while they write, with
// 507's words, leaving nothing; a failed build leaves no cache entries;
// a create right after killing a sandbox that filled the disk near the
// reserve is admitted.
func TestDiskThin(t *testing.T) {
	testenv.NeedRunsc(t)
	mnt := loopFS(t, thinFS)
	data := filepath.Join(mnt, "agentenv")
	logFile, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("server log (last 8 KiB): %s", b[max(0, len(b)-8<<10):])
		}
		logFile.Close()
	})
	registry := imagebuildtest.Registry(t)
	bombRef := pushBombImage(t, registry)
	reserve, err := sandbox.ParseDiskReserve(sandbox.DefaultDiskReserve)
	if err != nil {
		t.Fatal(err)
	}
	budget, err := sandbox.ParseDiskBudget(sandbox.DefaultDiskBudget)
	if err != nil {
		t.Fatal(err)
	}
	e := startServerWith(t, data, "10.129.0.0/20", "thn", func(c *server.Config) {
		c.Log = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.DiskReserve, c.DiskBudget = reserve, budget
		c.StepBuilds.RegistryAllow = []string{registry}
		// A create from the hot pool takes no new disk: every create here
		// boots or restores.
		c.Limits.HotPool = 0
	})
	ctx := context.Background()
	var mu sync.Mutex
	var live []string
	t.Cleanup(func() {
		for _, id := range live {
			e.client.KillSandbox(ctx, id)
		}
		if err := e.stop(); err != nil {
			t.Error(err)
		}
	})
	keep := func(sbs ...client.Sandbox) {
		mu.Lock()
		defer mu.Unlock()
		for _, sb := range sbs {
			live = append(live, sb.SandboxID)
		}
	}
	killAll := func() []string {
		mu.Lock()
		ids := live
		live = nil
		mu.Unlock()
		for _, id := range ids {
			if err := e.client.KillSandbox(ctx, id); err != nil {
				t.Errorf("kill %s: %v", id, err)
			}
		}
		return ids
	}
	const reserveBytes = 2 << 30
	start := availBytes(t, mnt)
	t.Logf("data filesystem: %d MiB, %d MiB free after the server's start (busybox template made)", thinFS>>20, start>>20)

	t.Run("64 creates at once", func(t *testing.T) {
		before := availBytes(t, mnt)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for range 64 {
			wg.Go(func() {
				sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
				if err != nil {
					errs <- err
					return
				}
				keep(sb)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("create: %v", err)
		}
		syncFS()
		used := before - availBytes(t, mnt)
		t.Logf("64 idle sandboxes (2 GiB layers): %d MiB of the data filesystem, write layers %d KiB in all", used>>20, filestoreBytes(data)>>10)
	})

	t.Run("fork of 64", func(t *testing.T) {
		parent, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
		if err != nil {
			t.Fatalf("create the parent: %v", err)
		}
		keep(parent)
		before := availBytes(t, mnt)
		kids, errs, err := e.client.ForkSandbox(ctx, parent.SandboxID, 64)
		if err != nil {
			t.Fatalf("fork of 64: %v", err)
		}
		keep(kids...)
		for _, err := range errs {
			if err != nil {
				t.Errorf("fork child: %v", err)
			}
		}
		if len(kids) != 64 {
			t.Errorf("fork gave %d children, want 64", len(kids))
		}
		syncFS()
		t.Logf("fork of 64 with 65 sandboxes running: %d MiB of the data filesystem, write layers %d KiB in all", (before-availBytes(t, mnt))>>20, filestoreBytes(data)>>10)
	})
	waitGone(t, data, killAll())

	ballast := filepath.Join(mnt, "ballast")
	t.Cleanup(func() { os.Remove(ballast) })

	t.Run("upload past the reserve", func(t *testing.T) {
		leaveFree(t, mnt, ballast, reserveBytes+256<<20)
		tid, _ := newStepBuild(t, e, "upl")
		body := io.LimitReader(zeros{}, 512<<20)
		code, msg := putFiles(t, e, tid, strings.Repeat("a", 64), body)
		if code != http.StatusInsufficientStorage || !strings.Contains(msg, "--disk-reserve") {
			t.Fatalf("upload of 512 MiB with 256 MiB above the reserve: HTTP %d %s, want 507 naming --disk-reserve", code, msg)
		}
		t.Logf("upload refused: %s", msg)
		if left := filesUnder(filepath.Join(data, "template-files", tid)); len(left) > 0 {
			t.Errorf("the refused upload left %v", left)
		}
		syncFS()
		if free := availBytes(t, mnt); free < reserveBytes+200<<20 {
			t.Errorf("after the refused upload %d MiB free, want its bytes given back (about %d)", free>>20, (reserveBytes+256<<20)>>20)
		}
	})

	t.Run("gzip bomb in a COPY step", func(t *testing.T) {
		leaveFree(t, mnt, ballast, reserveBytes+256<<20)
		tid, bid := newStepBuild(t, e, "bombcopy")
		var bomb bytes.Buffer
		io.Copy(&bomb, gzipBomb(t, 1024, 1<<20))
		hash := sha256Hex(bomb.Bytes())
		if code, msg := putFiles(t, e, tid, hash, bytes.NewReader(bomb.Bytes())); code/100 != 2 {
			t.Fatalf("upload of the bomb (%d bytes): HTTP %d %s", bomb.Len(), code, msg)
		}
		info := runStepBuild(t, e, tid, bid, wire.TemplateBuildStartV2{FromTemplate: "busybox", Steps: []wire.TemplateStep{
			{Type: "COPY", Args: []string{".", "/bomb/"}, FilesHash: hash},
		}})
		wantRefused(t, "a COPY of a 1 GiB gzip bomb", info)
		noBuildLeftovers(t, data)
	})

	t.Run("gzip bomb as an image layer", func(t *testing.T) {
		leaveFree(t, mnt, ballast, reserveBytes+256<<20)
		tid, bid := newStepBuild(t, e, "bombimage")
		info := runStepBuild(t, e, tid, bid, wire.TemplateBuildStartV2{FromImage: bombRef})
		wantRefused(t, "fromImage of an image whose layer is a 1 GiB gzip bomb", info)
		noBuildLeftovers(t, data)
	})

	t.Run("RUN past the reserve", func(t *testing.T) {
		leaveFree(t, mnt, ballast, reserveBytes+256<<20)
		tid, bid := newStepBuild(t, e, "rundd")
		info := runStepBuild(t, e, tid, bid, wire.TemplateBuildStartV2{FromTemplate: "busybox", Steps: []wire.TemplateStep{
			{Type: "RUN", Args: []string{"dd if=/dev/zero of=/big bs=1M count=1024", "root"}},
		}})
		wantRefused(t, "a RUN writing 1 GiB with 256 MiB above the reserve", info)
		noBuildLeftovers(t, data)
	})

	t.Run("failed build leaves nothing", func(t *testing.T) {
		os.Remove(ballast)
		tid, bid := newStepBuild(t, e, "runfail")
		info := runStepBuild(t, e, tid, bid, wire.TemplateBuildStartV2{FromTemplate: "busybox", Steps: []wire.TemplateStep{
			{Type: "RUN", Args: []string{"dd if=/dev/zero of=/big bs=1M count=200", "root"}},
			{Type: "RUN", Args: []string{"exit 3", "root"}},
		}})
		if info.Status != "error" {
			t.Fatalf("a build whose last step exits 3: status %s, want error", info.Status)
		}
		noBuildLeftovers(t, data)
	})

	t.Run("kill then create near the edge", func(t *testing.T) {
		os.Remove(ballast)
		a, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
		if err != nil {
			t.Fatal(err)
		}
		keep(a)
		if res := e.sh(t, a, "dd if=/dev/zero of=/tmp/fill bs=1M count=256 && sync"); res.ExitCode != 0 {
			t.Fatalf("dd in the sandbox: exit %d %s", res.ExitCode, res.Stderr)
		}
		syncFS()
		// 4 MiB above the reserve: less than a create needs.
		leaveFree(t, mnt, ballast, reserveBytes+4<<20)
		_, err = e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
		ce := wantStatus(t, "create 4 MiB above the reserve", err, 507)
		t.Logf("near the edge: %s", ce.Message)
		killAll()
		b, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
		if err != nil {
			t.Fatalf("create right after killing the sandbox that held 256 MiB: %v", err)
		}
		keep(b)
	})
}

// leaveFree sizes ballast (on mnt's filesystem) so that free bytes are
// left for ordinary writers.
func leaveFree(t *testing.T, mnt, ballast string, free int64) {
	t.Helper()
	os.Remove(ballast)
	syncFS()
	avail := availBytes(t, mnt)
	if avail < free {
		t.Fatalf("only %d MiB free on the test's filesystem, want %d", avail>>20, free>>20)
	}
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, avail-free); err != nil {
		t.Fatalf("fallocate ballast: %v", err)
	}
	syncFS()
}

func syncFS() { exec.Command("sync").Run() }

// filestoreBytes is what the sandboxes' write layers under data take.
func filestoreBytes(data string) int64 {
	files, _ := filepath.Glob(filepath.Join(data, "sandboxes", "*", "bundle", "rootfs", ".gvisor.filestore.*"))
	var n int64
	for _, f := range files {
		var st syscall.Stat_t
		if syscall.Stat(f, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// waitGone polls until the directories of killed sandboxes are gone
// (their teardowns run behind the kills' answers).
func waitGone(t *testing.T, data string, ids []string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for _, id := range ids {
		for {
			if _, err := os.Stat(filepath.Join(data, "sandboxes", id)); err != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s's directory is still there", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// filesUnder lists the regular files under dir.
func filesUnder(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// noBuildLeftovers checks that a failed build left no cache entries,
// scratch or half-written entries.
func noBuildLeftovers(t *testing.T, data string) {
	t.Helper()
	for _, d := range []string{"bases", "layers", "tmp", "scratch", "trees"} {
		if ents, _ := os.ReadDir(filepath.Join(data, "build", d)); len(ents) > 0 {
			t.Errorf("build/%s has %d entries after a failed build", d, len(ents))
		}
	}
}

// wantRefused checks that a build failed for the disk's reserve.
func wantRefused(t *testing.T, what string, info wire.TemplateBuildInfo) {
	t.Helper()
	msg := ""
	if info.Reason != nil {
		msg = info.Reason.Message
	}
	if info.Status != "error" || !strings.Contains(msg, "no room on the host disk") || !strings.Contains(msg, "--disk-reserve") {
		t.Fatalf("%s: status %s, reason %q; want an error saying there is no room and naming --disk-reserve", what, info.Status, msg)
	}
	t.Logf("%s: %s", what, msg)
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// apiDo sends an API request with the test key and decodes a JSON answer.
func apiDo(t *testing.T, e *env, method, url string, body any, out any) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", e.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
	if resp.StatusCode/100 != 2 {
		t.Logf("%s %s: HTTP %d %s", method, url, resp.StatusCode, b)
	}
	return resp.StatusCode
}

// newStepBuild starts E2B's build of a template (POST /v3/templates).
func newStepBuild(t *testing.T, e *env, name string) (templateID, buildID string) {
	t.Helper()
	var resp wire.TemplateRequestResponseV3
	if code := apiDo(t, e, "POST", e.api+"/v3/templates", wire.TemplateBuildRequestV3{Name: name}, &resp); code != http.StatusAccepted {
		t.Fatalf("POST /v3/templates: HTTP %d", code)
	}
	return resp.TemplateID, resp.BuildID
}

// putFiles uploads a COPY step's archive as the SDK does (the upload URL
// from GET /templates/{id}/files/{hash}, then a PUT without a key).
func putFiles(t *testing.T, e *env, tid, hash string, body io.Reader) (int, string) {
	t.Helper()
	var up wire.TemplateBuildFileUpload
	if code := apiDo(t, e, "GET", e.api+"/templates/"+tid+"/files/"+hash, nil, &up); code/100 != 2 {
		t.Fatalf("upload URL: HTTP %d", code)
	}
	req, err := http.NewRequest("PUT", up.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		// The server may answer and close before the body is all sent.
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var apiErr struct {
		Message string `json:"message"`
	}
	json.Unmarshal(b, &apiErr)
	return resp.StatusCode, apiErr.Message
}

// runStepBuild starts the build and polls its status until it ends.
func runStepBuild(t *testing.T, e *env, tid, bid string, start wire.TemplateBuildStartV2) wire.TemplateBuildInfo {
	t.Helper()
	if code := apiDo(t, e, "POST", e.api+"/v2/templates/"+tid+"/builds/"+bid, start, nil); code/100 != 2 {
		t.Fatalf("start build: HTTP %d", code)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var info wire.TemplateBuildInfo
		if code := apiDo(t, e, "GET", e.api+"/templates/"+tid+"/builds/"+bid+"/status", nil, &info); code != http.StatusOK {
			t.Fatalf("build status: HTTP %d", code)
		}
		if info.Status == "ready" || info.Status == "error" {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s still %s after 5 minutes", tid, info.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pushBombImage pushes to host an image whose one layer is a gzip bomb
// (1 GiB of zeros in 1 MiB files, a few MB compressed).
func pushBombImage(t *testing.T, host string) string {
	t.Helper()
	var bomb bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	buf := make([]byte, 1<<20)
	for i := range 1024 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%05d", i), Mode: 0o644, Size: int64(len(buf)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(buf)
	}
	tw.Close()
	gz.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(bomb.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goruntime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref := host + "/bomb:latest"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	t.Logf("bomb image: a %d-byte layer that unpacks to 1 GiB", bomb.Len())
	return ref
}
