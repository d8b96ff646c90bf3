package lifecycletest

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// viaProxy GETs envd's /health of sandbox id through the proxy and
// returns the status (0 if the request failed) and how long it took.
func viaProxy(t *testing.T, proxyURL, id string, timeout time.Duration) (int, time.Duration) {
	t.Helper()
	return viaProxyWith(t, proxyURL, id, "", timeout)
}

// viaProxyWith is viaProxy with envd's access token (none if "").
func viaProxyWith(t *testing.T, proxyURL, id, token string, timeout time.Duration) (int, time.Duration) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, proxyURL+"/health", nil)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(envdapi.Port))
	start := time.Now()
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, time.Since(start)
	}
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// The proxy follows a sandbox through pause, resume and kill: it answers
// while running, 502 while paused or gone, and traffic with envd's token
// wakes a sandbox created with autoResume (keyless traffic gets 401).
func TestUnprivilegedProxyFollowsState(t *testing.T) {
	x := newHost(t)
	p := x.proxy()
	sb := x.create(sandbox.CreateRequest{})
	auto := x.create(sandbox.CreateRequest{Lifecycle: sandbox.Lifecycle{AutoPause: true, AutoResume: true}})
	for _, id := range []string{sb.ID, auto.ID} {
		if code, _ := viaProxy(t, p.URL, id, 5*time.Second); code/100 != 2 {
			t.Fatalf("running %s through the proxy: %d, want 2xx", id, code)
		}
		if _, err := x.m.Pause(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	if code, took := viaProxy(t, p.URL, sb.ID, 5*time.Second); code != http.StatusBadGateway {
		t.Errorf("paused sandbox through the proxy: %d after %v, want 502 at once", code, took)
	}
	// Only traffic with envd's token wakes it: a keyless caller must not
	// keep someone's sandbox running.
	if code, _ := viaProxy(t, p.URL, auto.ID, 5*time.Second); code != http.StatusUnauthorized {
		t.Errorf("paused autoResume sandbox through the proxy without envd's token: %d, want 401", code)
	}
	if got := x.state(auto.ID); got != "paused" {
		t.Errorf("autoResume sandbox after keyless traffic: %s, want paused", got)
	}
	if code, _ := viaProxyWith(t, p.URL, auto.ID, auto.AccessToken, 5*time.Second); code/100 != 2 {
		t.Errorf("paused autoResume sandbox through the proxy: %d, want 2xx (traffic resumes it)", code)
	}
	if got := x.state(auto.ID); got != "running" {
		t.Errorf("autoResume sandbox after traffic: %s, want running", got)
	}
	if _, err := x.m.Resume(t.Context(), sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if code, _ := viaProxy(t, p.URL, sb.ID, 5*time.Second); code/100 != 2 {
		t.Errorf("resumed sandbox through the proxy: %d, want 2xx", code)
	}
	if err := x.m.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := viaProxy(t, p.URL, sb.ID, 5*time.Second); code != http.StatusBadGateway {
		t.Errorf("killed sandbox through the proxy: %d, want 502", code)
	}
}

// A request in flight through the proxy ends when its sandbox is killed,
// not when the client gives up.
func TestUnprivilegedProxyRequestEndsWithSandbox(t *testing.T) {
	x := newHost(t)
	p := x.proxy()
	sb := x.create(sandbox.CreateRequest{})
	// Frozen behind the manager's back: envd takes the connection and
	// never answers.
	if err := x.rt.(runtime.Pauser).Pause(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code int
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		code, took := viaProxy(t, p.URL, sb.ID, 30*time.Second)
		done <- result{code, took}
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("request to a frozen sandbox ended early: %d after %v", r.code, r.took)
	default:
	}
	killed := time.Now()
	if err := x.m.Kill(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.code != http.StatusBadGateway {
			t.Errorf("request to a sandbox killed meanwhile: %d, want 502 (an empty 200 passes for an answer)", r.code)
		}
		// Ended by the kill, not by its own 30 s timeout; 15 s leaves a
		// loaded host room to stall.
		if after := time.Since(killed); after > 15*time.Second {
			t.Errorf("request ended %v after the kill", after)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("request through the proxy still open 20s after its sandbox was killed")
	}
}

// Requests keep flowing through the proxy while the sandbox is paused
// and resumed over and over: each answers 2xx or 502, never hangs.
func TestUnprivilegedProxyDuringPauseResume(t *testing.T) {
	x := newHost(t)
	p := x.proxy()
	sb := x.create(sandbox.CreateRequest{})
	stop := make(chan struct{})
	flipped := make(chan int)
	go func() {
		n := 0
		defer func() { flipped <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := x.m.Pause(t.Context(), sb.ID); err == nil {
				n++
			}
			time.Sleep(2 * time.Millisecond)
			x.m.Resume(t.Context(), sb.ID, 0)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	ok, bad := 0, 0
	for range 100 {
		// A request that reached envd just before a pause waits for the
		// resume (milliseconds later).
		code, took := viaProxy(t, p.URL, sb.ID, 10*time.Second)
		switch {
		case code/100 == 2:
			ok++
		case code == http.StatusBadGateway:
			bad++
		default:
			t.Errorf("request during pause/resume: %d after %v", code, took)
		}
	}
	close(stop)
	if n := <-flipped; n == 0 {
		t.Error("no pause happened during the requests")
	}
	if ok == 0 {
		t.Errorf("no request succeeded (%d answered 502)", bad)
	}
	t.Logf("%d answered, %d 502", ok, bad)
}
