package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

// TestListPagesREST pages through GET /v2/sandboxes as E2B's SDKs do:
// limit, X-Next-Token, newest first, X-Total-Running; bad parameters 400.
func TestListPagesREST(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	suite := fmt.Sprintf("pages-%d", os.Getpid())
	var ids []string
	for i := range 5 {
		sb := e.create(t, client.CreateRequest{Metadata: map[string]string{"suite": suite, "i": strconv.Itoa(i)}})
		ids = append(ids, sb.SandboxID)
	}
	md := url.Values{"suite": {suite}}.Encode()
	q := url.Values{"metadata": {md}, "limit": {"2"}}
	var got []string
	for page := 0; ; page++ {
		items, next, err := e.client.ListSandboxesPage(ctx, q)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if len(items) > 2 {
			t.Fatalf("page %d: got %d sandboxes, want at most 2", page, len(items))
		}
		for _, sb := range items {
			got = append(got, sb.SandboxID)
		}
		if next == "" {
			break
		}
		q.Set("nextToken", next)
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Errorf("got %v over the pages, want newest first %v", got, want)
	}

	resp := e.rawGet(t, "/v2/sandboxes?state=running&metadata="+url.QueryEscape(md)+"&limit=1")
	if h := resp.Header.Get("X-Total-Running"); h != "5" {
		t.Errorf("got X-Total-Running %q, want 5 (before paging)", h)
	}
	if resp.Header.Get("X-Next-Token") == "" {
		t.Error("got no X-Next-Token with 5 matches and limit=1")
	}
	for _, bad := range []string{"limit=0", "limit=101", "nextToken=bogus", "order=sideways", "state=dead", "startedAfter=now"} {
		if resp := e.rawGet(t, "/v2/sandboxes?"+bad); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v2/sandboxes?%s: got HTTP %d, want 400", bad, resp.StatusCode)
		}
	}
	// The v1 route answers every match at once.
	var v1 []client.Sandbox
	if err := e.rawGetJSON(t, "/sandboxes?metadata="+url.QueryEscape(md)+"&limit=1", &v1); err != nil || len(v1) != 5 {
		t.Errorf("GET /sandboxes: got %d sandboxes (%v), want all 5", len(v1), err)
	}
}

// TestMetricsREST checks a sample against what the sandbox does: CPU
// burnt shows in cpuUsedPct, memory it holds in memUsed, a file written to
// its write layer (on disk) in diskUsed; several sandboxes at once; a
// sandbox paused without memory has none; a killed one is 404.
func TestMetricsREST(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{MemoryMB: 512})
	other := e.create(t, client.CreateRequest{})
	first := e.sampleMetric(t, sb.SandboxID)
	if first.MemTotal != 512<<20 || first.CPUCount < 1 || first.MemUsed <= 0 || first.DiskUsed <= 0 || first.DiskTotal < first.DiskUsed {
		t.Errorf("got %+v, want memTotal 512 MiB, cpuCount ≥ 1, memUsed > 0, 0 < diskUsed ≤ diskTotal", first)
	}
	// 64 MiB into the write layer, 64 MiB into /dev/shm (memory), and a
	// busy loop.
	res := e.sh(t, sb, "dd if=/dev/urandom of=/home/user/fill bs=1M count=64 && sync && "+
		"dd if=/dev/urandom of=/dev/shm/fill bs=1M count=64 && "+
		"i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
	if res.ExitCode != 0 {
		t.Fatalf("writes: exit %d: %s", res.ExitCode, res.Stderr)
	}
	m := e.sampleMetric(t, sb.SandboxID)
	t.Logf("before: %+v", first)
	t.Logf("after 64 MiB to disk, 64 MiB to /dev/shm, a busy loop: %+v", m)
	if m.CPUUsedPct < 1 {
		t.Errorf("got cpuUsedPct %.2f after a busy loop, want ≥ 1", m.CPUUsedPct)
	}
	if grew := m.MemUsed - first.MemUsed; grew < 48<<20 {
		t.Errorf("memUsed grew %d MiB after writing 64 MiB to /dev/shm, want ≥ 48 MiB", grew>>20)
	}
	if grew := m.DiskUsed - first.DiskUsed; grew < 48<<20 {
		t.Errorf("diskUsed grew %d MiB after writing 64 MiB to /home/user, want ≥ 48 MiB", grew>>20)
	}
	if m.MemUsed > m.MemTotal || m.DiskUsed > m.DiskTotal {
		t.Errorf("got more used than total: %+v", m)
	}

	all, err := e.client.SandboxesMetrics(ctx, []string{sb.SandboxID, other.SandboxID, "nosuchsandbox"})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[sb.SandboxID].MemTotal != 512<<20 || all[other.SandboxID].CPUCount < 1 {
		t.Errorf("got %+v, want samples of the two live sandboxes only", all)
	}
	if resp := e.rawGet(t, "/sandboxes/metrics"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /sandboxes/metrics without sandbox_ids: got HTTP %d, want 400", resp.StatusCode)
	}
	// Paused without its memory, nothing runs: no sample, not an error.
	req, _ := http.NewRequest(http.MethodPost, e.api+"/sandboxes/"+other.SandboxID+"/pause", strings.NewReader(`{"memory":false}`))
	req.Header.Set("X-API-Key", e.key)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("pause without memory: %v %v", resp, err)
	}
	if ms, err := e.client.SandboxMetrics(ctx, other.SandboxID); err != nil || len(ms) != 0 {
		t.Errorf("metrics of a sandbox paused without memory: got %v, %v; want no samples", ms, err)
	}
	if err := e.client.KillSandbox(ctx, other.SandboxID); err != nil {
		t.Fatal(err)
	}
	var ce *client.Error
	if _, err := e.client.SandboxMetrics(ctx, other.SandboxID); !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
		t.Errorf("metrics of a killed sandbox: got %v, want 404", err)
	}
}

// TestE2BSDKListAndMetrics runs tests/e2b/list.test.mjs: Sandbox.list
// paging and filters and getMetrics through the official JS SDK.
func TestE2BSDKListAndMetrics(t *testing.T) { runSDKTest(t, sharedServer(t), "list.test.mjs") }

func (e *env) sampleMetric(t *testing.T, id string) client.Metric {
	t.Helper()
	ms, err := e.client.SandboxMetrics(context.Background(), id)
	if err != nil {
		t.Fatalf("metrics of %s: %v", id, err)
	}
	if len(ms) != 1 {
		t.Fatalf("metrics of %s: got %d samples, want 1", id, len(ms))
	}
	return ms[0]
}

// rawGet sends an authenticated GET to the API and returns the answer, its
// body read and closed.
func (e *env) rawGet(t *testing.T, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.api+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func (e *env) rawGetJSON(t *testing.T, path string, out any) error {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.api+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
