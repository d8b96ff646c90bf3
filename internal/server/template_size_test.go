package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	wire "github.com/agentenv/agentenv/client/api"
)

// TestTemplateSizeIsSandboxDefault: a template built with E2B's build
// options cpuCount and memoryMB gives its sandboxes that memory (MemTotal
// inside) and CPUs when their create asks for none, and a create's own
// memoryMB still wins, as on E2B.
func TestTemplateSizeIsSandboxDefault(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	const name = "sized-1g"
	var created wire.TemplateRequestResponseV3
	e.jsonCall(t, "POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name, CPUCount: 1, MemoryMB: 1024}, http.StatusAccepted, &created)
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), name) })
	e.jsonCall(t, "POST", "/v2/templates/"+name+"/builds/"+created.BuildID, wire.TemplateBuildStartV2{
		FromTemplate: "busybox", Steps: []wire.TemplateStep{{Type: "RUN", Args: []string{"echo sized > /sized", "root"}}},
	}, http.StatusAccepted, nil)
	waitBuild(t, e, name, created.BuildID)

	tpl, err := e.client.GetTemplate(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.CPUCount != 1 || tpl.MemoryMB != 1024 {
		t.Errorf("template shows cpuCount %d, memoryMB %d; want 1, 1024", tpl.CPUCount, tpl.MemoryMB)
	}
	for _, tc := range []struct {
		name          string
		req           client.CreateRequest
		wantCPUs      int
		wantMemTotalK int
	}{
		{"template's size", client.CreateRequest{TemplateID: name}, 1, 1 << 20},
		{"request's memory wins", client.CreateRequest{TemplateID: name, MemoryMB: 768}, 1, 768 << 10},
		{"request's CPUs win", client.CreateRequest{TemplateID: name, CPUCount: 2}, 2, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := e.create(t, tc.req)
			if sb.CPUCount != tc.wantCPUs {
				t.Errorf("cpuCount = %d, want %d", sb.CPUCount, tc.wantCPUs)
			}
			res := e.sh(t, sb, "grep MemTotal /proc/meminfo; cat /sized")
			want := fmt.Sprintf("MemTotal: %d kB", tc.wantMemTotalK)
			if got := strings.Join(strings.Fields(string(res.Stdout)), " "); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "sized") {
				t.Errorf("got %q (exit %d, stderr %q), want %q and the build's file", res.Stdout, res.ExitCode, res.Stderr, want)
			}
		})
	}
	// Above the server's maximum, a request is refused; the template's
	// own size never is (it is capped).
	status, body := e.rawRequest(t, "POST", "/sandboxes", testKey, strings.NewReader(`{"templateID":"`+name+`","memoryMB":1000000}`))
	if status != http.StatusBadRequest {
		t.Errorf("create with memoryMB 1000000: got %d %v, want 400", status, body)
	}

	// agentenv's own build route (the CLI's template build --memory-mb)
	// sizes a template the same way.
	if _, err := e.client.BuildTemplate(ctx, client.BuildRequest{Name: "sized-legacy", Busybox: true, MemoryMB: 768}, func(client.BuildProgress) {}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), "sized-legacy") })
	sb := e.create(t, client.CreateRequest{TemplateID: "sized-legacy"})
	if got := strings.Join(strings.Fields(string(e.sh(t, sb, "grep MemTotal /proc/meminfo").Stdout)), " "); got != "MemTotal: 786432 kB" {
		t.Errorf("sandbox of a template built with memoryMB 768: got %q, want MemTotal: 786432 kB", got)
	}
}

// jsonCall sends body as JSON to the API with the test key, checks the
// status and decodes the answer into out (unless nil).
func (e *env) jsonCall(t *testing.T, method, path string, body any, wantStatus int, out any) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.api+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s: got %d %s, want %d", method, path, resp.StatusCode, got, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(got, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, got)
		}
	}
}

// waitBuild polls a step build until it is ready; it fails the test with
// the build's log if the build fails or takes over 5 minutes.
func waitBuild(t *testing.T, e *env, templateID, buildID string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var info wire.TemplateBuildInfo
		e.jsonCall(t, "GET", "/templates/"+templateID+"/builds/"+buildID+"/status", nil, http.StatusOK, &info)
		switch info.Status {
		case "ready":
			return
		case "error":
			t.Fatalf("build of %s failed: %+v", templateID, info.Reason)
		}
		if time.Now().After(deadline) {
			t.Fatalf("build of %s still %s after 5 minutes", templateID, info.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
