package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
)

// A sandbox with egress resolves names through its gateway (the slot's
// forwarder, here to the tests' resolver on loopback) and reaches what
// they name; without egress its lookups are refused at once. What the
// policy blocks is refused too, not left to time out.
func TestSandboxDNS(t *testing.T) {
	e := sharedServer(t)
	in := fakeInternet(t, e)
	sb := e.createRaw(t, map[string]any{"templateID": "busybox"})
	res := e.sh(t, sb, "cat /etc/resolv.conf; timeout 10 nslookup known.agentenv.test 2>&1; echo exit=$?")
	out := string(res.Stdout)
	if !strings.Contains(out, "nameserver 169.254.0.22") {
		t.Errorf("resolv.conf in the sandbox: got %q, want nameserver 169.254.0.22", out)
	}
	if !strings.Contains(out, "203.0.113.77") || !strings.Contains(out, "exit=0") {
		t.Errorf("nslookup known.agentenv.test with egress: got %q, want 203.0.113.77", out)
	}
	// libc's resolver (wget) and the fake internet behind the name.
	res = e.sh(t, sb, "timeout 10 wget -q -O - http://inet.agentenv.test:7777/ 2>&1; echo exit=$?")
	if got := string(res.Stdout); !strings.Contains(got, "hello from the fake internet") {
		t.Errorf("wget by name: got %q, want the fake internet's page", got)
	}
	// A blocked address (a private one of the fake internet) is refused.
	res = e.sh(t, sb, "timeout 5 nc "+strings.Replace(in.private, ":", " ", 1)+" </dev/null 2>&1; echo exit=$?")
	if got := strings.ToLower(string(res.Stdout)); !strings.Contains(got, "refused") {
		t.Errorf("nc to the blocked %s: got %q, want connection refused", in.private, got)
	}

	off := e.createRaw(t, map[string]any{"templateID": "busybox", "allow_internet_access": false})
	res = e.sh(t, off, "timeout 10 nslookup known.agentenv.test 2>&1; echo exit=$?")
	if got := string(res.Stdout); strings.Contains(got, "203.0.113.77") || !strings.Contains(got, "REFUSED") {
		t.Errorf("nslookup with egress off: got %q, want REFUSED and no address", got)
	}
	res = e.sh(t, off, "timeout 5 nc "+strings.Replace(in.public, ":", " ", 1)+" </dev/null 2>&1; echo exit=$?")
	if got := strings.ToLower(string(res.Stdout)); !strings.Contains(got, "refused") {
		t.Errorf("nc to %s with egress off: got %q, want connection refused", in.public, got)
	}
}

// A template build step resolves names too (its build sandbox's slot has
// the default egress policy, and its forwarder answers).
func TestBuildStepDNS(t *testing.T) {
	e := sharedServer(t)
	status, created := e.rawRequest(t, "POST", "/v3/templates", testKey, strings.NewReader(`{"name":"dnsbuild"}`))
	if status != 202 {
		t.Fatalf("POST /v3/templates: %d %v", status, created)
	}
	id, _ := created["templateID"].(string)
	build, _ := created["buildID"].(string)
	t.Cleanup(func() { e.client.DeleteTemplate(context.Background(), id) })
	start := `{"fromTemplate":"busybox","steps":[{"type":"RUN","args":["timeout 20 nslookup known.agentenv.test > /resolved.txt 2>&1; cat /resolved.txt","root"]}]}`
	if status, body := e.rawRequest(t, "POST", "/v2/templates/"+id+"/builds/"+build, testKey, strings.NewReader(start)); status != 202 {
		t.Fatalf("start the build: %d %v", status, body)
	}
	var info map[string]any
	for deadline := time.Now().Add(3 * time.Minute); ; {
		_, info = e.rawRequest(t, "GET", "/templates/"+id+"/builds/"+build+"/status", testKey, nil)
		if s := info["status"]; s == "ready" || s == "error" || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if info["status"] != "ready" {
		t.Fatalf("build status: %v, want ready", info)
	}
	sb := e.create(t, client.CreateRequest{TemplateID: id})
	res := e.sh(t, sb, "cat /resolved.txt; cat /etc/resolv.conf")
	if got := string(res.Stdout); !strings.Contains(got, "203.0.113.77") || !strings.Contains(got, "nameserver 169.254.0.22") {
		t.Errorf("the build step's lookup and the template's resolv.conf: got %q, want 203.0.113.77 and nameserver 169.254.0.22", got)
	}
}
