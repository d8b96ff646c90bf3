package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

// status is the HTTP status of a client error (0: none or not HTTP).
func status(err error) int {
	var e *client.Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func ids(sbs []client.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.SandboxID)
	}
	slices.Sort(out)
	return out
}

// TestNamedKeys drives one server with two named keys (alice, bob), the
// operator key and the single key: neither named key can see, read,
// change or kill the other's sandboxes and snapshots, or restore the
// other's snapshot; templates are usable by all; the operator and the single key
// see both.
func TestNamedKeys(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	alice, bob := client.New(e.api, e.proxy, aliceKey), client.New(e.api, e.proxy, bobKey)
	op := client.New(e.api, e.proxy, operatorKey)
	suite := map[string]string{"suite": fmt.Sprintf("keys-%d", os.Getpid())}
	create := func(c *client.Client, template string) client.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: template, Metadata: suite})
		if err != nil {
			t.Fatalf("create %s: %v", template, err)
		}
		t.Cleanup(func() { e.client.KillSandbox(context.Background(), sb.SandboxID) })
		return sb
	}
	a := create(alice, "busybox") // templates are usable by all
	b := create(bob, "busybox")

	list := func(c *client.Client) []string {
		t.Helper()
		sbs, err := c.ListSandboxes(ctx, suite)
		if err != nil {
			t.Fatal(err)
		}
		return ids(sbs)
	}
	both := ids([]client.Sandbox{a, b})
	for _, tc := range []struct {
		who  string
		c    *client.Client
		want []string
	}{
		{"alice", alice, []string{a.SandboxID}}, {"bob", bob, []string{b.SandboxID}},
		{"the operator", op, both}, {"the single key", e.client, both},
	} {
		if got := list(tc.c); !slices.Equal(got, tc.want) {
			t.Errorf("%s lists %v, want %v", tc.who, got, tc.want)
		}
	}

	// Nothing of bob's sandbox is alice's to read or touch: each answers
	// 404, as an unknown ID does.
	for name, call := range map[string]func() error{
		"get":     func() error { _, err := alice.GetSandbox(ctx, b.SandboxID); return err },
		"kill":    func() error { return alice.KillSandbox(ctx, b.SandboxID) },
		"timeout": func() error { return alice.SetTimeout(ctx, b.SandboxID, 600) },
		"pause":   func() error { return alice.PauseSandbox(ctx, b.SandboxID) },
		"resume":  func() error { _, err := alice.ResumeSandbox(ctx, b.SandboxID); return err },
		"metrics": func() error { _, err := alice.SandboxMetrics(ctx, b.SandboxID); return err },
		"snapshot": func() error {
			_, err := alice.SnapshotSandbox(ctx, b.SandboxID, "", nil)
			return err
		},
		"fork": func() error { _, _, err := alice.ForkSandbox(ctx, b.SandboxID, 1); return err },
	} {
		if err := call(); status(err) != http.StatusNotFound {
			t.Errorf("alice %s bob's sandbox: got %v, want 404", name, err)
		}
	}
	if sb, err := bob.GetSandbox(ctx, b.SandboxID); err != nil || sb.State != "running" {
		t.Fatalf("bob's sandbox after alice's attempts: %+v, %v; want it running", sb, err)
	}
	// Connect hands out the envd token and resumes a paused sandbox: not
	// to another key, running or paused.
	day := int64(86400)
	for _, paused := range []bool{false, true} {
		if paused {
			if err := bob.PauseSandbox(ctx, b.SandboxID); err != nil {
				t.Fatal(err)
			}
		}
		if sb, err := alice.ConnectSandbox(ctx, b.SandboxID, client.ConnectRequest{Timeout: &day}); status(err) != http.StatusNotFound || sb.EnvdAccessToken != "" {
			t.Errorf("alice connects to bob's sandbox (paused %v): got token %q, %v; want 404", paused, sb.EnvdAccessToken, err)
		}
	}
	if sb, err := bob.GetSandbox(ctx, b.SandboxID); err != nil || sb.State != "paused" {
		t.Fatalf("bob's paused sandbox after alice's connect: %+v, %v; want it still paused", sb, err)
	}
	if _, err := bob.ConnectSandbox(ctx, b.SandboxID, client.ConnectRequest{}); err != nil {
		t.Fatalf("bob connects to (resumes) his sandbox: %v", err)
	}
	if ms, err := alice.SandboxesMetrics(ctx, []string{a.SandboxID, b.SandboxID}); err != nil || len(ms) != 1 {
		t.Errorf("alice's metrics of both: got %d samples (%v), want hers only", len(ms), err)
	}

	// Snapshots: bob's is not alice's to list, read, delete or restore.
	snap, err := bob.SnapshotSandbox(ctx, b.SandboxID, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.client.DeleteSnapshot(context.Background(), snap.SnapshotID) })
	has := func(c *client.Client) bool {
		sns, err := c.ListSnapshots(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(sns, func(s client.Snapshot) bool { return s.SnapshotID == snap.SnapshotID })
	}
	if has(alice) || !has(bob) || !has(op) {
		t.Errorf("bob's snapshot listed: alice %v, bob %v, operator %v; want false, true, true", has(alice), has(bob), has(op))
	}
	if _, err := alice.CreateSandbox(ctx, client.CreateRequest{TemplateID: snap.SnapshotID}); status(err) != http.StatusNotFound {
		t.Errorf("alice restores bob's snapshot: got %v, want 404", err)
	}
	if err := alice.DeleteSnapshot(ctx, snap.SnapshotID); status(err) != http.StatusNotFound {
		t.Errorf("alice deletes bob's snapshot: got %v, want 404", err)
	}
	if err := alice.DeleteTemplate(ctx, snap.SnapshotID); status(err) != http.StatusNotFound {
		t.Errorf("alice deletes bob's snapshot by the template route: got %v, want 404", err)
	}
	if !has(bob) {
		t.Fatal("bob's snapshot is gone after alice's attempts")
	}

	// Bob's restores and fork children are his.
	r := create(bob, snap.SnapshotID)
	kids := e.fork(t, bob, b.SandboxID, 2)
	// The fork children take the parent's metadata (the suite).
	wantBob := ids([]client.Sandbox{b, r, kids[0], kids[1]})
	if got := list(bob); !slices.Equal(got, wantBob) {
		t.Errorf("bob lists %v after a restore and a fork, want %v", got, wantBob)
	}
	if got := list(alice); !slices.Equal(got, []string{a.SandboxID}) {
		t.Errorf("alice lists %v after bob's restore and fork, want only hers", got)
	}

	// The live page's data follows the same view.
	var data struct {
		Key       string `json:"key"`
		Sandboxes []struct{ ID string }
	}
	req, _ := http.NewRequest(http.MethodGet, e.api+"/ui/data", nil)
	req.Header.Set("X-API-Key", aliceKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&data)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if data.Key != "alice" || len(data.Sandboxes) != 1 || data.Sandboxes[0].ID != a.SandboxID {
		t.Errorf("/ui/data for alice: key %q, %d sandboxes %v; want alice and hers only", data.Key, len(data.Sandboxes), data.Sandboxes)
	}

	// The operator may kill anyone's; a wrong key is refused.
	if err := op.KillSandbox(ctx, a.SandboxID); err != nil {
		t.Errorf("operator kills alice's sandbox: %v", err)
	}
	if _, err := client.New(e.api, e.proxy, "alice-key-0123456788").ListSandboxes(ctx, nil); status(err) != http.StatusUnauthorized {
		t.Errorf("a wrong key: got %v, want 401", err)
	}
}

// TestNamedKeysTemplates: a template is its builder's. Bob may list alice's
// template and start sandboxes from it, but not rebuild it (by either
// build route) nor delete it: 403, and it is untouched. A new name is his
// to build, and the operator may delete anyone's.
func TestNamedKeysTemplates(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	alice, bob := client.New(e.api, e.proxy, aliceKey), client.New(e.api, e.proxy, bobKey)
	op := client.New(e.api, e.proxy, operatorKey)
	name := fmt.Sprintf("alice-py-%d", os.Getpid())
	built, err := alice.BuildTemplate(ctx, client.BuildRequest{Name: name, Busybox: true}, func(client.BuildProgress) {})
	if err != nil {
		t.Fatalf("alice builds %s: %v", name, err)
	}
	t.Cleanup(func() { op.DeleteTemplate(context.Background(), name) })

	if _, err := bob.BuildTemplate(ctx, client.BuildRequest{Name: name, Busybox: true}, func(client.BuildProgress) {}); status(err) != http.StatusForbidden {
		t.Errorf("bob rebuilds alice's template: got %v, want 403", err)
	}
	if _, err := bob.UploadTemplateWith(ctx, client.BuildRequest{Name: name, Image: "python:3.12"}, strings.NewReader("not read"), func(client.BuildProgress) {}); status(err) != http.StatusForbidden {
		t.Errorf("bob uploads a rootfs over alice's template: got %v, want 403", err)
	}
	if err := bob.DeleteTemplate(ctx, name); status(err) != http.StatusForbidden {
		t.Errorf("bob deletes alice's template: got %v, want 403", err)
	}
	if err := bob.DeleteTemplate(ctx, "busybox"); status(err) != http.StatusForbidden {
		t.Errorf("bob deletes the operator's busybox: got %v, want 403", err)
	}
	if got, err := bob.GetTemplate(ctx, name); err != nil || got.BuildID != built.BuildID || !got.CreatedAt.Equal(built.CreatedAt) {
		t.Errorf("alice's template after bob's attempts: %+v, %v; want her build untouched", got, err)
	}
	list, err := bob.ListTemplates(ctx)
	if err != nil || !slices.ContainsFunc(list, func(tp client.Template) bool { return tp.TemplateID == name }) {
		t.Errorf("bob's template list (%v) lacks alice's %s: every key may use it", err, name)
	}
	sb, err := bob.CreateSandbox(ctx, client.CreateRequest{TemplateID: name})
	if err != nil {
		t.Fatalf("bob creates a sandbox from alice's template: %v", err)
	}
	if err := bob.KillSandbox(ctx, sb.SandboxID); err != nil {
		t.Error(err)
	}
	if err := op.DeleteTemplate(ctx, name); err != nil {
		t.Errorf("the operator deletes alice's template: %v", err)
	}
}
