package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// chromium runs Debian's headless Chromium on url with args (--dump-dom,
// --screenshot=...) and returns its stdout. --virtual-time-budget lets the
// page's script fetch and render before the DOM is dumped.
func chromium(t *testing.T, url string, args ...string) []byte {
	t.Helper()
	bin := testenv.NeedCommand(t, "chromium", "the live page is checked in a real browser (make setup installs Debian's chromium)")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	home := t.TempDir() // a profile of its own: other tests may run Chromium too
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
		"--user-data-dir=" + filepath.Join(home, "profile"), "--virtual-time-budget=8000", "--window-size=1400,1100"}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.Bytes())
	}
	return out
}

// TestLivePage renders /ui in headless Chromium against a server running
// real sandboxes (created, exec'd, forked) and checks the DOM the page's
// script built: each sandbox in the top with its state, the template's
// counts, the latency charts fed. It writes a screenshot; with
// AGENTENV_UPDATE_UI_PNG=1 it replaces docs/ui.png.
func TestLivePage(t *testing.T) {
	e := sharedServer(t)
	testenv.NeedCommand(t, "chromium", "the live page is checked in a real browser (make setup installs Debian's chromium)")
	ctx := context.Background()

	// The page without a key shows the key form and no data; the data
	// route needs the key.
	if resp, err := http.Get(e.api + "/ui/data"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /ui/data without a key: %v, %v; want 401", resp.Status, err)
	}
	dom := string(chromium(t, e.api+"/ui", "--dump-dom"))
	if !strings.Contains(dom, `id="login" class=""`) || strings.Contains(dom, `data-ready="1"`) {
		t.Errorf("/ui without a key: want the key form shown and no data rendered; DOM:\n%.2000s", dom)
	}

	// A kill of a sandbox that is gone is what the SDKs do: not an error.
	if err := e.client.KillSandbox(ctx, "no-such-sandbox-0123456789"); !isStatus(err, 404) {
		t.Fatalf("kill of an unknown sandbox: got %v, want 404", err)
	}
	a := e.create(t, client.CreateRequest{Metadata: map[string]string{"run": "ui-a", "policy": "ppo"}})
	b := e.create(t, client.CreateRequest{Metadata: map[string]string{"run": "ui-b", "policy": "grpo"}})
	e.sh(t, a, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done") // some CPU, an exec
	e.sh(t, b, "echo hi")
	kids := e.fork(t, e.client, b.SandboxID, 2)
	if err := e.client.PauseSandbox(ctx, kids[1].SandboxID); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a.SandboxID: "running", b.SandboxID: "running", kids[0].SandboxID: "running", kids[1].SandboxID: "paused"}

	// What the page is fed.
	var data struct {
		Sandboxes []struct {
			ID, State string
			Sampled   bool
		}
		Live struct {
			History []struct {
				Ops map[string]struct{ N int64 }
			}
		}
	}
	req, _ := http.NewRequest(http.MethodGet, e.api+"/ui/data", nil)
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&data)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	fed := map[string]int64{}
	for _, p := range data.Live.History {
		for op, o := range p.Ops {
			fed[op] += o.N
		}
	}
	t.Logf("/ui/data: %d points, operations %v", len(data.Live.History), fed)
	for _, sb := range data.Sandboxes {
		if want[sb.ID] == "running" && !sb.Sampled {
			t.Errorf("/ui/data: running sandbox %s has no CPU/memory sample", sb.ID)
		}
	}

	dom = string(chromium(t, e.api+"/ui#key="+e.key, "--dump-dom"))
	if !strings.Contains(dom, `data-ready="1"`) {
		t.Fatalf("/ui: the page never rendered data; DOM:\n%.3000s", dom)
	}
	for id, state := range want {
		if !strings.Contains(dom, `data-id="`+id+`" data-state="`+state+`"`) {
			t.Errorf("/ui top: sandbox %s not shown as %s", id, state)
		}
	}
	// busybox row: at least our 3 running and 1 paused (other tests' may add).
	row := regexp.MustCompile(`<tr data-template="busybox"><td>busybox</td><td class="num n-running">(\d+)</td><td class="num n-paused">(\d+)</td>`).FindStringSubmatch(dom)
	if row == nil || atoi(row[1]) < 3 || atoi(row[2]) < 1 {
		t.Errorf("/ui by template: busybox row %q, want ≥3 running and ≥1 paused", row)
	}
	// Each chart counts at least what the page was fed before.
	for _, op := range []string{"create", "exec", "fork"} {
		m := regexp.MustCompile(`id="lat-` + op + `" data-count="(\d+)"`).FindStringSubmatch(dom)
		if m == nil || int64(atoi(m[1])) < max(fed[op], 1) {
			t.Errorf("/ui latency chart of %s: got %v, want at least %d operations counted", op, m, max(fed[op], 1))
		}
	}
	// The rollout table counts at least the two commands above as ok.
	if m := regexp.MustCompile(`data-kind="exec" data-class="ok" data-n="(\d+)"`).FindStringSubmatch(dom); m == nil || atoi(m[1]) < 2 {
		t.Errorf("/ui rollouts: commands ok %v, want at least 2", m)
	}
	if strings.Contains(dom, "<td>kill</td><td>not_found</td>") {
		t.Errorf("/ui errors: a kill of a sandbox that is gone is shown as an error")
	}
	for _, s := range []string{"run=ui-a", "policy=grpo"} {
		if !strings.Contains(dom, s) {
			t.Errorf("/ui: metadata %s not shown", s)
		}
	}

	png := filepath.Join(t.TempDir(), "ui.png")
	chromium(t, e.api+"/ui#key="+e.key, "--screenshot="+png)
	b2, err := os.ReadFile(png)
	if err != nil || !bytes.HasPrefix(b2, []byte("\x89PNG")) || len(b2) < 10_000 {
		t.Fatalf("screenshot: %d bytes, %v; want a PNG", len(b2), err)
	}
	if os.Getenv("AGENTENV_UPDATE_UI_PNG") == "1" {
		if err := os.WriteFile(filepath.Join(testenv.RepoRoot(), "docs", "ui.png"), b2, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
