package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestFleetVolumes runs volumes behind `agentenv api` for real: a
// 3-member etcd, two node agents in namespaces of their own, two API
// servers. A volume lives on one node; sandboxes that mount it are placed
// there; its content API works through either API server; a create that
// names volumes of two nodes is refused; a node that is away makes its
// volumes answer 503 naming it until it returns.
func TestFleetVolumes(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedRunsc(t)
	testenv.NeedCommand(t, "nsenter", "nodes run in their own network namespaces")
	ctx := context.Background()
	f := &fleetEnv{t: t, dir: t.TempDir()}
	f.bin = testenv.BuildAgentenv(t, t.TempDir())
	f.secret = "fleet-test-secret-0123456789abcdef"
	for name, content := range map[string]string{"secret": f.secret, "operator-key": opKey, "api-keys": "alice " + aliceKey + "\nbob " + bobKey} {
		if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f.nodeHTTP, f.certHTTP, f.etcdTLS = writeTLS(t, f.dir)
	f.netSetup(2)
	t.Cleanup(f.reapSandboxes)
	if err := os.MkdirAll(nodeData, 0o700); err != nil {
		t.Fatal(err)
	}
	f.startEtcd()
	f.nodes = append(f.nodes, f.startNode(1), f.startNode(2))
	f.startAPI(1)
	f.startAPI(2)
	defer f.logs()
	c1, c2 := f.clients[0], f.clients[1]
	f.waitAlive(c1, "n1", "n2")
	api1, api2 := f.apiURLs[0][0], f.apiURLs[1][0]

	vol := createVolume(t, api1, apiKey, "shared")
	home := f.volumeNode(vol.ID)
	other := map[string]string{"n1": "n2", "n2": "n1"}[home]
	t.Logf("volume %s lives on %s", vol.ID, home)

	var a, b client.Sandbox
	t.Run("content API through either API server, with the token of either", func(t *testing.T) {
		// Written through api2 with the token api1 handed out.
		st, body := volumeCall(t, http.MethodPut, api2, "/volumecontent/"+vol.ID+"/file?path=/from-api.txt", vol.Token, "written through the volume API")
		if st != http.StatusCreated {
			t.Fatalf("write through api2: HTTP %d %s, want 201", st, body)
		}
		again := getVolume(t, api2, apiKey, vol.ID)
		st, body = volumeCall(t, http.MethodGet, api1, "/volumecontent/"+vol.ID+"/file?path=/from-api.txt", again.Token, "")
		if st != http.StatusOK || body != "written through the volume API" {
			t.Fatalf("read through api1 with api2's token: HTTP %d %q", st, body)
		}
		st, body = volumeCall(t, http.MethodGet, api1, "/volumecontent/"+vol.ID+"/file?path=/from-api.txt", "vt_forged.x", "")
		if st != http.StatusUnauthorized {
			t.Fatalf("a forged token: HTTP %d %s, want 401", st, body)
		}
	})

	t.Run("two sandboxes mounting it land on its node and see each other's writes", func(t *testing.T) {
		var err error
		a, err = c1.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600)),
			VolumeMounts: []client.VolumeMount{{Name: "shared", Path: "/mnt/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		b, err = c2.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600)),
			VolumeMounts: []client.VolumeMount{{Name: "shared", Path: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range []client.Sandbox{a, b} {
			if got := f.sandboxNode(sb.SandboxID); got != home {
				t.Errorf("sandbox %s runs on %s, want %s (its volume's node)", sb.SandboxID, got, home)
			}
		}
		got, err := c2.GetSandbox(ctx, a.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.VolumeMounts) != 1 || got.VolumeMounts[0] != (client.VolumeMount{Name: "shared", Path: "/mnt/data"}) {
			t.Errorf("GET through api2 shows mounts %+v, want [{shared /mnt/data}]", got.VolumeMounts)
		}
		if out, err := execOut(ctx, c1, a, "cat /mnt/data/from-api.txt; echo from-a > /mnt/data/a.txt"); err != nil || out != "written through the volume API" {
			t.Fatalf("a reads the file the content API wrote: %q, %v", out, err)
		}
		if out, err := execOut(ctx, c2, b, "cat /data/a.txt; echo from-b > /data/b.txt"); err != nil || out != "from-a" {
			t.Fatalf("b reads what a wrote: %q, %v", out, err)
		}
		if out, err := execOut(ctx, c1, a, "cat /mnt/data/b.txt"); err != nil || out != "from-b" {
			t.Fatalf("a reads what b wrote: %q, %v", out, err)
		}
		if st, body := volumeCall(t, http.MethodGet, api2, "/volumecontent/"+vol.ID+"/file?path=/b.txt", vol.Token, ""); st != http.StatusOK || body != "from-b\n" {
			t.Fatalf("the content API reads what b wrote: HTTP %d %q", st, body)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("fork children and restores of its snapshot stay on the volume's node", func(t *testing.T) {
		sn, err := c1.SnapshotSandbox(ctx, a.SandboxID, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c1.DeleteSnapshot(ctx, sn.SnapshotID)
		kids, errs, err := c2.ForkSandbox(ctx, a.SandboxID, 2)
		if err != nil {
			t.Fatal(err)
		}
		restored, err := c2.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID, Timeout: new(int64(600))})
		if err != nil {
			t.Fatal(err)
		}
		for i, sb := range append(kids, restored) {
			if i < len(errs) && errs[i] != nil {
				t.Fatalf("fork child %d: %v", i, errs[i])
			}
			if got := f.sandboxNode(sb.SandboxID); got != home {
				t.Errorf("sandbox %s (fork child or restore) runs on %s, want %s", sb.SandboxID, got, home)
			}
			if out, err := execOut(ctx, c1, sb, "cat /mnt/data/b.txt"); err != nil || out != "from-b" {
				t.Errorf("sandbox %s reads the live volume: %q, %v", sb.SandboxID, out, err)
			}
			if err := c1.KillSandbox(ctx, sb.SandboxID); err != nil {
				t.Error(err)
			}
		}
		// With the node cordoned, neither may go elsewhere.
		if err := f.ops[0].NodeAction(ctx, home, "cordon"); err != nil {
			t.Fatal(err)
		}
		defer f.ops[0].NodeAction(ctx, home, "uncordon")
		_, err = c1.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID})
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, home) {
			t.Errorf("a restore of the snapshot with %s cordoned: %v, want 503 naming the node", home, err)
		}
		_, _, err = c1.ForkSandbox(ctx, a.SandboxID, 1)
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, home) {
			t.Errorf("a fork with %s cordoned: %v, want 503 naming the node", home, err)
		}
	})

	t.Run("delete is refused while mounted, naming the sandboxes", func(t *testing.T) {
		st, body := apiCall(t, http.MethodDelete, api2, apiKey, "/volumes/"+vol.ID, "")
		if st != http.StatusConflict || !strings.Contains(body, a.SandboxID) || !strings.Contains(body, b.SandboxID) {
			t.Fatalf("delete while mounted: HTTP %d %s, want 409 naming %s and %s", st, body, a.SandboxID, b.SandboxID)
		}
	})

	var second volumeJSON
	t.Run("volumes of two nodes in one create: 400; names unique across the fleet", func(t *testing.T) {
		// Made while the first volume's node is cordoned, so it goes to
		// the other node.
		if err := f.ops[0].NodeAction(ctx, home, "cordon"); err != nil {
			t.Fatal(err)
		}
		defer f.ops[0].NodeAction(ctx, home, "uncordon")
		second = createVolume(t, api1, apiKey, "elsewhere")
		if got := f.volumeNode(second.ID); got != other {
			t.Fatalf("volume made with %s cordoned lives on %s, want %s", home, got, other)
		}
		// The same name again would go to the other node too: refused
		// there, as the name is taken on this one.
		if st, body := apiCall(t, http.MethodPost, api2, apiKey, "/volumes", `{"name":"shared"}`); st != http.StatusBadRequest || !strings.Contains(body, "already exists") {
			t.Fatalf("a second volume named shared (on another node): HTTP %d %s, want 400 already exists", st, body)
		}
		// Another key's namespace is its own.
		alice := createVolume(t, api2, aliceKey, "shared")
		if st, body := apiCall(t, http.MethodGet, api1, bobKey, "/volumes/"+alice.ID, ""); st != http.StatusNotFound {
			t.Fatalf("bob reads alice's volume: HTTP %d %s, want 404", st, body)
		}
		if st, body := apiCall(t, http.MethodDelete, api1, aliceKey, "/volumes/"+alice.ID, ""); st != http.StatusNoContent {
			t.Fatalf("alice deletes her volume: HTTP %d %s", st, body)
		}

		_, err := c1.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox",
			VolumeMounts: []client.VolumeMount{{Name: "shared", Path: "/a"}, {Name: "elsewhere", Path: "/b"}}})
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "different") {
			t.Fatalf("a create naming volumes of %s and %s: %v, want 400 saying they live on different nodes", home, other, err)
		}
		// The volume's node is cordoned: its sandboxes cannot go
		// anywhere else.
		_, err = c2.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", VolumeMounts: []client.VolumeMount{{Name: "shared", Path: "/a"}}})
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, home) {
			t.Fatalf("a create mounting a volume of cordoned %s: %v, want 503 naming the node", home, err)
		}
		// E2B's error shapes, as serve gives them.
		_, err = c1.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox",
			VolumeMounts: []client.VolumeMount{{Name: "shared", Path: "relative"}, {Name: "no-such", Path: "/m"}}})
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusBadRequest ||
			!strings.Contains(e.Message, "#0: path must be absolute") || !strings.Contains(e.Message, "#1: volume 'no-such' not found") {
			t.Fatalf("bad mounts: %v, want 400 listing both", err)
		}
	})

	t.Run("delete after the sandboxes are killed", func(t *testing.T) {
		for _, sb := range []client.Sandbox{a, b} {
			if err := c1.KillSandbox(ctx, sb.SandboxID); err != nil {
				t.Fatal(err)
			}
		}
		if st, body := apiCall(t, http.MethodDelete, api2, apiKey, "/volumes/"+vol.ID, ""); st != http.StatusNoContent {
			t.Fatalf("delete after kill: HTTP %d %s, want 204", st, body)
		}
		if _, err := os.Stat(filepath.Join(f.dir, home, "volumes", vol.ID)); !os.IsNotExist(err) {
			t.Errorf("the volume's directory on %s: %v, want it gone", home, err)
		}
		if st, _ := apiCall(t, http.MethodGet, api1, apiKey, "/volumes/"+vol.ID, ""); st != http.StatusNotFound {
			t.Errorf("GET of the deleted volume: HTTP %d, want 404", st)
		}
		// Its name is free again, fleet-wide.
		again := createVolume(t, api1, apiKey, "shared")
		apiCall(t, http.MethodDelete, api1, apiKey, "/volumes/"+again.ID, "")
	})

	t.Run("one name, many creates at once through both API servers: one volume", func(t *testing.T) {
		var mu sync.Mutex
		var made []volumeJSON
		statuses := map[int]int{}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				st, body := apiCall(t, http.MethodPost, f.apiURLs[i%2][0], apiKey, "/volumes", `{"name":"raced"}`)
				mu.Lock()
				defer mu.Unlock()
				statuses[st]++
				var v volumeJSON
				if st == http.StatusCreated && json.Unmarshal([]byte(body), &v) == nil {
					made = append(made, v)
				}
			})
		}
		wg.Wait()
		if len(made) != 1 || statuses[http.StatusBadRequest] != 7 {
			t.Errorf("8 concurrent creates of one name: statuses %v, %d made; want one 201 and seven 400", statuses, len(made))
		}
		for _, v := range made {
			apiCall(t, http.MethodDelete, api1, apiKey, "/volumes/"+v.ID, "")
		}
		if st, body := apiCall(t, http.MethodGet, api2, apiKey, "/volumes/not-a-uuid", ""); st != http.StatusBadRequest {
			t.Errorf("GET of a malformed volume ID: HTTP %d %s, want 400 as serve answers", st, body)
		}
	})

	t.Run("a node that is away makes its volumes answer 503 naming it, until it returns", func(t *testing.T) {
		if second.ID == "" {
			t.Skip("no second volume")
		}
		idx := map[string]int{"n1": 0, "n2": 1}[other]
		if st, body := volumeCall(t, http.MethodPut, api1, "/volumecontent/"+second.ID+"/file?path=/kept.txt", second.Token, "kept"); st != http.StatusCreated {
			t.Fatalf("write: HTTP %d %s", st, body)
		}
		f.nodes[idx].stop(syscall.SIGTERM)
		f.waitLost(c1, other)
		st, body := apiCall(t, http.MethodGet, api1, apiKey, "/volumes/"+second.ID, "")
		if st != http.StatusServiceUnavailable || !strings.Contains(body, other) {
			t.Fatalf("GET of a volume whose node is away: HTTP %d %s, want 503 naming %s", st, body, other)
		}
		if st, body := volumeCall(t, http.MethodGet, api2, "/volumecontent/"+second.ID+"/file?path=/kept.txt", second.Token, ""); st != http.StatusServiceUnavailable || !strings.Contains(body, other) {
			t.Fatalf("content of a volume whose node is away: HTTP %d %s, want 503 naming %s", st, body, other)
		}
		_, err := c2.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", VolumeMounts: []client.VolumeMount{{Name: "elsewhere", Path: "/e"}}})
		if e := (*client.Error)(nil); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, other) {
			t.Fatalf("a create mounting a volume of lost %s: %v, want 503 naming the node", other, err)
		}
		if st, body := apiCall(t, http.MethodGet, api2, apiKey, "/volumes", ""); st != http.StatusOK || !strings.Contains(body, second.ID) {
			t.Fatalf("list while its node is away: HTTP %d %s, want it listed", st, body)
		}
		f.nodes[idx] = f.startNode(idx + 1)
		f.waitAlive(c1, other)
		eventually(t, 30*time.Second, "the volume answers again", func() error {
			st, body := volumeCall(t, http.MethodGet, api2, "/volumecontent/"+second.ID+"/file?path=/kept.txt", second.Token, "")
			if st != http.StatusOK || body != "kept" {
				return fmt.Errorf("HTTP %d %q", st, body)
			}
			return nil
		})
		if st, body := apiCall(t, http.MethodDelete, api1, apiKey, "/volumes/"+second.ID, ""); st != http.StatusNoContent {
			t.Fatalf("delete after the node returned: HTTP %d %s", st, body)
		}
	})

	t.Run("e2b SDK volumes suite through an API server", func(t *testing.T) {
		node := testenv.NeedCommand(t, "node", "the e2b SDK check needs Node.js")
		dir := filepath.Join(testenv.RepoRoot(), "tests", "e2b")
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b")); err != nil {
			t.Fatalf("tests/e2b/node_modules/e2b missing: make setup installs it (npm ci)")
		}
		cmd := exec.Command(node, "--test", "--test-reporter=spec", "volumes.test.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "E2B_API_URL="+api1, "E2B_SANDBOX_URL="+f.apiURLs[0][1], "E2B_API_KEY="+apiKey, "E2B_DEBUG=",
			"E2B_VOLUME_API_URL="+api2)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("volumes.test.mjs against the fleet: %v\n%s", err, out)
		}
	})
}

type volumeJSON struct {
	ID    string `json:"volumeID"`
	Name  string `json:"name"`
	Token string `json:"token"`
}

// apiCall sends a REST call with an API key and returns the status and body.
func apiCall(t *testing.T, method, base, key, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	return send(t, req)
}

// volumeCall sends a content API call with a volume token.
func volumeCall(t *testing.T, method, base, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return send(t, req)
}

func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func createVolume(t *testing.T, base, key, name string) volumeJSON {
	t.Helper()
	st, body := apiCall(t, http.MethodPost, base, key, "/volumes", `{"name":"`+name+`"}`)
	if st != http.StatusCreated {
		t.Fatalf("create volume %s: HTTP %d %s", name, st, body)
	}
	var v volumeJSON
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.ID == "" || v.Token == "" {
		t.Fatalf("create volume %s: %s (%v)", name, body, err)
	}
	return v
}

func getVolume(t *testing.T, base, key, id string) volumeJSON {
	t.Helper()
	st, body := apiCall(t, http.MethodGet, base, key, "/volumes/"+id, "")
	var v volumeJSON
	if st != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil || v.Token == "" {
		t.Fatalf("get volume %s: HTTP %d %s", id, st, body)
	}
	return v
}

// volumeNode names the node whose data dir holds volume id.
func (f *fleetEnv) volumeNode(id string) string {
	return f.holder("volumes", id)
}

// sandboxNode names the node whose data dir holds sandbox id.
func (f *fleetEnv) sandboxNode(id string) string {
	return f.holder("sandboxes", id)
}

func (f *fleetEnv) holder(kind, id string) string {
	f.t.Helper()
	var found []string
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := os.Stat(filepath.Join(f.dir, n, kind, id)); err == nil {
			found = append(found, n)
		}
	}
	if len(found) != 1 {
		f.t.Fatalf("%s %s is held by nodes %v, want exactly one", kind, id, found)
	}
	return found[0]
}
