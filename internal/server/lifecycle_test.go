package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// E2B's lifecycle: autoPause at the timeout (with or without memory),
// autoResume by traffic, connect resumes, and the proxy's answers for a
// sandbox that is not running.

// proxyGet sends GET path to a sandbox's envd through the proxy, as the
// SDK does (E2b-Sandbox-Id / -Port headers).
func (e *env) proxyGet(t *testing.T, id, path string) (int, map[string]any) {
	t.Helper()
	return e.proxyGetWith(t, id, path, "")
}

// proxyGetWith is proxyGet with envd's access token (none if "").
func (e *env) proxyGetWith(t *testing.T, id, path, token string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", e.proxy+path, nil)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// waitState polls the sandbox until it is in state want (60 s at most: a
// safety net, not a measurement).
func (e *env) waitState(t *testing.T, id, want string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sb, err := e.client.GetSandbox(context.Background(), id)
		if err == nil && sb.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s not %s after 60s (last: %+v, %v)", id, want, sb, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connect is E2B's POST /sandboxes/{id}/connect; it returns the status.
func (e *env) connect(t *testing.T, id string, body string) int {
	t.Helper()
	status, out := e.rawRequest(t, "POST", "/sandboxes/"+id+"/connect", testKey, strings.NewReader(body))
	if status/100 != 2 {
		t.Fatalf("connect %s: %d %v", id, status, out)
	}
	return status
}

// notRunning checks the proxy's answer for a sandbox that does not run:
// E2B's 502 body, which the SDK's isRunning reads as false.
func (e *env) notRunning(t *testing.T, id string) {
	t.Helper()
	status, body := e.proxyGet(t, id, "/health")
	want := map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": 502.0}
	if status != http.StatusBadGateway || !reflect.DeepEqual(body, want) {
		t.Errorf("envd of a sandbox that is not running: %d %v, want 502 %v", status, body, want)
	}
}

func TestTimeoutPausesAndConnectResumes(t *testing.T) {
	e := sharedServer(t)
	// The timeout is set short only once the memory server runs: 3 s from
	// create could end during its setup on a loaded host.
	sb := e.createRaw(t, map[string]any{"templateID": "busybox", "timeout": 120, "autoPause": true})
	if got, _ := e.client.GetSandbox(context.Background(), sb.SandboxID); got.SandboxID == "" {
		t.Fatal("no sandbox")
	}
	v := startMemoryServer(t, e, sb)
	if err := e.client.SetTimeout(context.Background(), sb.SandboxID, 2); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.SandboxID, "paused")
	e.notRunning(t, sb.SandboxID)
	_, info := e.rawRequest(t, "GET", "/sandboxes/"+sb.SandboxID, testKey, nil)
	if lc, _ := info["lifecycle"].(map[string]any); lc["onTimeout"] != "pause" || lc["autoResume"] != false {
		t.Errorf("lifecycle %v, want onTimeout pause, autoResume false", info["lifecycle"])
	}
	if got := e.connect(t, sb.SandboxID, `{"timeout": 30}`); got != http.StatusCreated {
		t.Errorf("connect to a paused sandbox: %d, want 201 (resumed)", got)
	}
	if got := askMemoryServer(t, e, sb); got != v {
		t.Errorf("after connect the memory server answers %q, want %q (memory kept)", got, v)
	}
	if got := e.connect(t, sb.SandboxID, `{"timeout": 30}`); got != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d, want 200", got)
	}
}

func TestAutoResumeByTraffic(t *testing.T) {
	e := sharedServer(t)
	// A create timeout long enough for every step after the auto-resume
	// on a loaded host; the pause is brought forward once the memory
	// server runs (3 s from create could end during its setup).
	sb := e.createRaw(t, map[string]any{"templateID": "busybox", "timeout": 120, "autoPause": true, "autoResume": map[string]any{"enabled": true}})
	v := startMemoryServer(t, e, sb)
	if err := e.client.SetTimeout(context.Background(), sb.SandboxID, 2); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, sb.SandboxID, "paused")
	// Traffic without envd's token (or with another's) is refused before
	// it wakes the sandbox: anyone who knows its ID could keep it awake.
	for _, tok := range []string{"", "not-its-token"} {
		if status, out := e.proxyGetWith(t, sb.SandboxID, "/health", tok); status != http.StatusUnauthorized {
			t.Errorf("request with token %q to a paused auto-resume sandbox: %d %v, want 401", tok, status, out)
		}
	}
	if got, _ := e.client.GetSandbox(context.Background(), sb.SandboxID); got.State != "paused" {
		t.Fatalf("state %q after traffic without envd's token, want paused", got.State)
	}
	// 20 requests at once: one resume, every request answered.
	var wg sync.WaitGroup
	statuses := make([]int, 20)
	for i := range statuses {
		wg.Go(func() { statuses[i], _ = e.proxyGetWith(t, sb.SandboxID, "/health", sb.EnvdAccessToken) })
	}
	wg.Wait()
	for i, s := range statuses {
		if s/100 != 2 {
			t.Errorf("request %d to an auto-resuming sandbox: %d, want 2xx", i, s)
		}
	}
	got, _ := e.client.GetSandbox(context.Background(), sb.SandboxID)
	if got.State != "running" {
		t.Errorf("state %q after traffic, want running", got.State)
	}
	// It runs its create timeout again (2 min), not the nothing it had
	// left nor the 2 s set before the pause.
	if left := time.Until(got.EndAt); left < time.Minute || left > 2*time.Minute {
		t.Errorf("%v left after auto-resume, want about the create timeout (2m0s)", left)
	}
	if got := askMemoryServer(t, e, sb); got != v {
		t.Errorf("after auto-resume the memory server answers %q, want %q", got, v)
	}
}

// filesScript changes the sandbox's files in every way a resume without
// memory must keep: new files (also in a new directory, also a symlink and
// a hard link), a changed mode and owner, a deleted file of the template;
// and it leaves a process behind, which a resume must not. Run as root.
const filesScript = `set -e
mkdir -p /home/user/new/deep && echo deep > /home/user/new/deep/f
echo tmp > /tmp/kept && chown 1000:1000 /tmp/kept && chmod 0751 /tmp/kept
ln -s /tmp/kept /tmp/link && ln /tmp/kept /tmp/hard
rm /bin/yes
sleep 31337 >/dev/null 2>&1 &
cat /proc/sys/kernel/random/boot_id`

// filesCheck prints what checkFilesKept expects (the bracket keeps grep
// from finding itself).
const filesCheck = `cat /home/user/new/deep/f /tmp/kept /tmp/link; stat -c %a:%u:%h /tmp/kept
test -e /bin/yes && echo yes-back || echo yes-gone
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' | grep -q 'sleep 3133[7]' && echo process-kept || echo process-gone
cat /proc/sys/kernel/random/boot_id`

func checkFilesKept(t *testing.T, e *env, sb client.Sandbox, bootBefore string) {
	t.Helper()
	out := strings.Fields(e.envdAs(t, sb, "root").sh(filesCheck))
	if len(out) != 7 || out[0] != "deep" || out[1] != "tmp" || out[2] != "tmp" || out[3] != "751:1000:2" || out[4] != "yes-gone" || out[5] != "process-gone" {
		t.Fatalf("after a resume without memory got %q, want deep tmp tmp 751:1000:2 yes-gone process-gone <boot id>", out)
	}
	if out[6] == bootBefore {
		t.Errorf("boot id %s unchanged: the sandbox was not booted again", bootBefore)
	}
}

// filesTemplates are the templates the tests of a pause without memory run
// on: busybox, and one of GNU tools (whose tar once lost every file of a
// Debian sandbox on resume).
func filesTemplates(t *testing.T, e *env) []string {
	return []string{"busybox", gnuTemplate(t, e)}
}

func TestPauseWithoutMemory(t *testing.T) {
	e := sharedServer(t)
	for _, tpl := range filesTemplates(t, e) {
		t.Run(tpl, func(t *testing.T) {
			sb := e.create(t, client.CreateRequest{TemplateID: tpl, Timeout: new(int64(60))})
			boot := strings.TrimSpace(e.envdAs(t, sb, "root").sh(filesScript))
			start := time.Now()
			if status, out := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`)); status != http.StatusNoContent {
				t.Fatalf("pause with memory false: %d %v", status, out)
			}
			paused := time.Since(start)
			e.waitState(t, sb.SandboxID, "paused")
			e.notRunning(t, sb.SandboxID)
			if status, _ := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`)); status != http.StatusConflict {
				t.Errorf("second pause: %d, want 409", status)
			}
			start = time.Now()
			if got := e.connect(t, sb.SandboxID, `{"timeout": 60}`); got != http.StatusCreated {
				t.Errorf("connect: %d, want 201", got)
			}
			t.Logf("%s: pause without memory %v, resume %v", tpl, paused.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			checkFilesKept(t, e, sb, boot)
			// And again: what the first resume restored is kept by a second pause.
			if status, out := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`)); status != http.StatusNoContent {
				t.Fatalf("second pause with memory false: %d %v", status, out)
			}
			e.connect(t, sb.SandboxID, `{"timeout": 60}`)
			checkFilesKept(t, e, sb, boot)
		})
	}
}

func TestTimeoutPauseWithoutMemory(t *testing.T) {
	e := sharedServer(t)
	if status, out := e.rawRequest(t, "POST", "/sandboxes", testKey, strings.NewReader(`{"templateID":"busybox","autoPauseMemory":false}`)); status != http.StatusBadRequest {
		t.Errorf("autoPauseMemory false without autoPause: %d %v, want 400", status, out)
	}
	if status, out := e.rawRequest(t, "POST", "/sandboxes", testKey, strings.NewReader(`{"templateID":"busybox","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`)); status != http.StatusBadRequest {
		t.Errorf("autoPauseMemory false with autoResume: %d %v, want 400", status, out)
	}
	for _, tpl := range filesTemplates(t, e) {
		t.Run(tpl, func(t *testing.T) {
			// Short timeout only after the script: 3 s from create could
			// pause the sandbox while the script runs on a loaded host.
			sb := e.createRaw(t, map[string]any{"templateID": tpl, "timeout": 120, "autoPause": true, "autoPauseMemory": false})
			boot := strings.TrimSpace(e.envdAs(t, sb, "root").sh(filesScript))
			if err := e.client.SetTimeout(context.Background(), sb.SandboxID, 2); err != nil {
				t.Fatal(err)
			}
			e.waitState(t, sb.SandboxID, "paused")
			e.notRunning(t, sb.SandboxID)
			e.connect(t, sb.SandboxID, `{"timeout": 60}`)
			checkFilesKept(t, e, sb, boot)
		})
	}
}

// TestE2BLifecycle runs tests/e2b/lifecycle.test.mjs: the official SDK's
// lifecycle options, isRunning, connect and pause({keepMemory: false}).
func TestE2BLifecycle(t *testing.T) { runSDKTest(t, sharedServer(t), "lifecycle.test.mjs") }

// pausedWithoutMemory makes a sandbox with a file and pauses it without
// its memory, on the server at api (for the restart test: such a sandbox
// has nothing but its files, which a restart must keep).
func pausedWithoutMemory(t *testing.T, c *client.Client, api string) client.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, sb, "/bin/sh", []string{"-c", "echo files-only > /tmp/files-only"}, nil, nil); err != nil || res.ExitCode != 0 {
		t.Fatalf("prepare: %v %v", res, err)
	}
	if status := post(t, api+"/sandboxes/"+sb.SandboxID+"/pause", `{"memory": false}`); status != http.StatusNoContent {
		t.Fatalf("pause without memory: %d", status)
	}
	return sb
}

// resumedWithFiles checks that a sandbox paused without memory is still
// paused and resumes with its file.
func resumedWithFiles(t *testing.T, c *client.Client, api string, sb client.Sandbox) {
	t.Helper()
	ctx := context.Background()
	if got, err := c.GetSandbox(ctx, sb.SandboxID); err != nil || got.State != "paused" {
		t.Fatalf("sandbox paused without memory, after a restart: %+v, %v; want it paused", got, err)
	}
	if status := post(t, api+"/sandboxes/"+sb.SandboxID+"/connect", `{"timeout": 60}`); status != http.StatusCreated {
		t.Fatalf("connect after restart: %d, want 201", status)
	}
	if res, err := c.Exec(ctx, sb, "/bin/sh", []string{"-c", "cat /tmp/files-only"}, nil, nil); err != nil || string(res.Stdout) != "files-only\n" {
		t.Errorf("after restart and resume: %q, %v; want its file", res.Stdout, err)
	}
}

func post(t *testing.T, url, body string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("X-API-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
