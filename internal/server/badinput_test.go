package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

// rawRequest sends a request to the API and returns status and body.
func (e *env) rawRequest(t *testing.T, method, path, key string, body io.Reader) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, e.api+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

func TestBadInput(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{})
	before, _ := e.client.ListSandboxes(ctx, nil)
	templatesBefore, _ := e.client.ListTemplates(ctx)

	huge := `{"templateID":"busybox","metadata":{"badinput":"1","k":"` + strings.Repeat("x", 2<<20) + `"}}`
	tests := []struct {
		name, method, path, key, body string
		want                          int
	}{
		{"unknown template", "POST", "/sandboxes", testKey, `{"templateID":"no-such-template"}`, 404},
		{"missing template", "POST", "/sandboxes", testKey, `{}`, 400},
		{"malformed JSON", "POST", "/sandboxes", testKey, `{"templateID":`, 400},
		{"wrong JSON type", "POST", "/sandboxes", testKey, `{"templateID":5}`, 400},
		{"negative timeout", "POST", "/sandboxes", testKey, `{"templateID":"busybox","timeout":-5,"metadata":{"badinput":"1"}}`, 400},
		{"huge timeout", "POST", "/sandboxes", testKey, `{"templateID":"busybox","timeout":999999999999,"metadata":{"badinput":"1"}}`, 400},
		{"absurd memory", "POST", "/sandboxes", testKey, `{"templateID":"busybox","memoryMB":99999999,"metadata":{"badinput":"1"}}`, 400},
		{"body over limit", "POST", "/sandboxes", testKey, huge, 413},
		{"missing API key", "POST", "/sandboxes", "", `{"templateID":"busybox","metadata":{"badinput":"1"}}`, 401},
		{"wrong API key", "GET", "/sandboxes", "wrong", ``, 401},
		{"unknown sandbox get", "GET", "/sandboxes/inosuchsandbox0000000", testKey, ``, 404},
		{"unknown sandbox kill", "DELETE", "/sandboxes/inosuchsandbox0000000", testKey, ``, 404},
		{"unknown sandbox timeout", "POST", "/sandboxes/inosuchsandbox0000000/timeout", testKey, `{"timeout":10}`, 404},
		{"negative set timeout", "POST", "/sandboxes/" + sb.SandboxID + "/timeout", testKey, `{"timeout":-1}`, 400},
		{"missing set timeout", "POST", "/sandboxes/" + sb.SandboxID + "/timeout", testKey, `{}`, 400},
		{"bad template name", "POST", "/agentenv/templates", testKey, `{"name":"../evil","busybox":true}`, 400},
		{"template without source", "POST", "/agentenv/templates", testKey, `{"name":"nosource"}`, 400},
		{"template relative rootfs", "POST", "/agentenv/templates", testKey, `{"name":"rel","rootfs":"some/dir"}`, 400},
		{"template client mirror", "POST", "/agentenv/templates", testKey, `{"name":"mir","debian":"bookworm","mirror":"http://127.0.0.1:9/x"}`, 400},
		{"template bad package", "POST", "/agentenv/templates", testKey, `{"name":"pk","debian":"bookworm","packages":["a;rm -rf /"]}`, 400},
		{"delete template in use", "DELETE", "/templates/busybox", testKey, ``, 409},
		{"delete unknown template", "DELETE", "/templates/nope", testKey, ``, 404},
		{"unknown route", "GET", "/nope", testKey, ``, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.rawRequest(t, tc.method, tc.path, tc.key, strings.NewReader(tc.body))
			if status != tc.want {
				t.Errorf("status = %d, want %d (body %v)", status, tc.want, body)
			}
			if msg, _ := body["message"].(string); msg == "" {
				t.Errorf("error body has no message: %v", body)
			}
			if code, _ := body["code"].(float64); int(code) != tc.want {
				t.Errorf("body code = %v, want %d", body["code"], tc.want)
			}
		})
	}

	// The only requests that name a usable template carry this metadata:
	// a sandbox with it was made by a request that should have failed.
	// (Counting sandboxes is not enough: a create an earlier test gave up
	// on under load can still land while this test runs.)
	after, _ := e.client.ListSandboxes(ctx, nil)
	for _, s := range after {
		if s.Metadata["badinput"] != "" {
			t.Errorf("a bad request made sandbox %s (metadata %v)", s.SandboxID, s.Metadata)
		}
	}
	if len(after) != len(before) {
		t.Logf("sandboxes: %d before, %d after (not from these requests)", len(before), len(after))
	}
	templatesAfter, _ := e.client.ListTemplates(ctx)
	if len(templatesAfter) != len(templatesBefore) {
		t.Errorf("bad requests changed the template count: %d before, %d after", len(templatesBefore), len(templatesAfter))
	}
	if res := e.sh(t, sb, "echo still fine"); string(res.Stdout) != "still fine\n" {
		t.Errorf("sandbox after bad requests: stdout %q", res.Stdout)
	}
}

func TestEnvdAccessToken(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"wrong token", "wrong", 401},
		{"no token", "", 401},
		{"right token", sb.EnvdAccessToken, 404}, // the file does not exist
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", e.proxy+"/files?path=/no/such/file", nil)
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "49983")
			if tc.token != "" {
				req.Header.Set("X-Access-Token", tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	// Unknown sandbox through the proxy: 502, as the E2B SDK expects.
	req, _ := http.NewRequest("GET", e.proxy+"/health", nil)
	req.Header.Set("E2b-Sandbox-Id", "inosuchsandbox0000000")
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("unknown sandbox through proxy: status %d, want 502", resp.StatusCode)
	}
}

func TestPathsStayInsideSandbox(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	sb := e.create(t, client.CreateRequest{})
	if _, err := os.Stat("/etc/shadow"); err != nil {
		t.Skip("host has no /etc/shadow to compare with")
	}
	// busybox has no /etc/shadow: a read that escaped would find the host's.
	if b, err := e.client.ReadFile(ctx, sb, "../../etc/shadow"); err == nil {
		t.Fatalf("read ../../etc/shadow returned %d bytes; want not found inside the sandbox", len(b))
	}
	// The default user may write /tmp (not /etc): the write lands in the
	// sandbox's /tmp, never the host's.
	const escape = "../../../../tmp/agentenv-escape-test"
	if err := e.client.WriteFile(ctx, sb, escape, bytes.NewReader([]byte("inside"))); err != nil {
		t.Fatalf("write %s: %v", escape, err)
	}
	if _, err := os.Stat("/tmp/agentenv-escape-test"); err == nil {
		os.Remove("/tmp/agentenv-escape-test")
		t.Fatal("a write to ../../../../tmp in the sandbox created a file on the host")
	}
	if res := e.sh(t, sb, "cat /tmp/agentenv-escape-test"); string(res.Stdout) != "inside" {
		t.Errorf("the file should be inside the sandbox at /tmp/agentenv-escape-test; cat gave %q", res.Stdout)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// createRaw creates a sandbox from a raw JSON body and kills it when the
// test ends.
func (e *env) createRaw(t *testing.T, body map[string]any) client.Sandbox {
	t.Helper()
	b, _ := json.Marshal(body)
	status, out := e.rawRequest(t, "POST", "/sandboxes", testKey, bytes.NewReader(b))
	if status != 201 {
		t.Fatalf("create %s: %d %v", b, status, out)
	}
	id, _ := out["sandboxID"].(string)
	t.Cleanup(func() { e.client.KillSandbox(context.Background(), id) })
	sb, err := e.client.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}
