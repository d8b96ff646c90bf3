package api

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
)

// createAs makes a build of name for key and returns its answer, or the
// status when it is refused.
func (e *stepEnv) createAs(key, name string) (wire.TemplateRequestResponseV3, int) {
	e.t.Helper()
	var out wire.TemplateRequestResponseV3
	code, _ := e.doAs(key, "POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name}, &out)
	return out, code
}

// uploadURL runs the SDK's handshake for key.
func (e *stepEnv) uploadURL(key, templateID, hash string) (wire.TemplateBuildFileUpload, int) {
	e.t.Helper()
	var fu wire.TemplateBuildFileUpload
	code, _ := e.doAs(key, "GET", "/templates/"+templateID+"/files/"+hash, nil, &fu)
	return fu, code
}

// startAs starts a build from image "a" with steps.
func (e *stepEnv) startAs(key, templateID, buildID string, steps ...wire.TemplateStep) (int, string) {
	e.t.Helper()
	return e.doAs(key, "POST", "/v2/templates/"+templateID+"/builds/"+buildID, wire.TemplateBuildStartV2{FromImage: "a", Steps: steps}, nil)
}

// statusAs is the build's status as key reads it ("" when not found).
func (e *stepEnv) statusAs(key, templateID, buildID string) string {
	e.t.Helper()
	var info wire.TemplateBuildInfo
	if code, _ := e.doAs(key, "GET", "/templates/"+templateID+"/builds/"+buildID+"/status", nil, &info); code != http.StatusOK {
		return ""
	}
	return info.Status
}

// waitStatus polls until the build has status want.
func (e *stepEnv) waitStatus(key, templateID, buildID, want string) {
	e.t.Helper()
	got := ""
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if got = e.statusAs(key, templateID, buildID); got == want {
			return
		}
	}
	e.t.Fatalf("build %s of %s: status %q, want %q", buildID, templateID, got, want)
}

// COPY inputs are their owner's: another key's upload under the same
// template and hash neither is present to nor reaches alice's build; the
// builder sees files by the server's hash of their bytes; an archive is
// never replaced; a stated digest is checked. Once the name is alice's,
// bob can neither upload for it, build it, nor retag it, nor read her
// builds.
func TestStepBuildInputsPerOwner(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, nil)
	ra, code := e.createAs(aliceStepKey, "app")
	if code != http.StatusAccepted {
		t.Fatalf("alice creates app: HTTP %d", code)
	}
	if _, code := e.uploadURL(bobStepKey, "app", hashA); code != http.StatusNotFound {
		t.Errorf("bob's upload URL for alice's build: HTTP %d, want 404 (he has no build of app)", code)
	}
	// Bob makes his own build of the (not yet built) name and uploads
	// his bytes under the hash alice's SDK computes.
	rb, code := e.createAs(bobStepKey, "app")
	if code != http.StatusAccepted {
		t.Fatalf("bob creates app while no build of it runs: HTTP %d", code)
	}
	fu, _ := e.uploadURL(bobStepKey, "app", hashA)
	if code, body := e.doAs("", "PUT", fu.URL, "bob's bytes", nil); code != http.StatusCreated {
		t.Fatalf("bob's PUT: HTTP %d %s", code, body)
	}
	fu, _ = e.uploadURL(aliceStepKey, "app", hashA)
	if fu.Present {
		t.Errorf("alice's handshake says present after only bob uploaded: she would skip her upload and build with his bytes")
	}
	if code, body := e.doAs("", "PUT", fu.URL, "alice's bytes", nil); code != http.StatusCreated {
		t.Fatalf("alice's PUT: HTTP %d %s", code, body)
	}
	// Never replaced: the same bytes again are fine, others refused.
	if code, body := e.doAs("", "PUT", fu.URL, "alice's bytes", nil); code != http.StatusOK {
		t.Errorf("alice's PUT of the same bytes again: HTTP %d %s, want 200", code, body)
	}
	if code, body := e.doAs("", "PUT", fu.URL, "other bytes", nil); code != http.StatusConflict || !strings.Contains(body, "never replaced") {
		t.Errorf("a PUT of other bytes under a stored hash: HTTP %d %s, want 409 saying it is never replaced", code, body)
	}
	// A digest the client states is checked against what arrived.
	fu2, _ := e.uploadURL(aliceStepKey, "app", hashB)
	req, _ := http.NewRequest("PUT", fu2.URL, strings.NewReader("cut on the way"))
	sum := sha256.Sum256([]byte("the whole archive"))
	req.Header.Set("Content-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a PUT whose bytes do not match its Content-Digest: HTTP %d, want 400", resp.StatusCode)
	}
	if fu2, _ = e.uploadURL(aliceStepKey, "app", hashB); fu2.Present {
		t.Errorf("a refused upload is present")
	}

	copyStep := wire.TemplateStep{Type: "COPY", Args: []string{"app.py", "/app/"}, FilesHash: hashA}
	if code, body := e.startAs(aliceStepKey, "app", ra.BuildID, copyStep); code != http.StatusAccepted {
		t.Fatalf("alice starts: HTTP %d %s", code, body)
	}
	e.waitStatus(aliceStepKey, "app", ra.BuildID, statusReady)
	spec := e.steps.specs[0]
	if spec.Owner != "alice" || spec.Steps[0].FilesHash != sha256Hex("alice's bytes") {
		t.Errorf("builder got owner %q, COPY files %s; want alice and the SHA-256 of her bytes (the cache key)", spec.Owner, spec.Steps[0].FilesHash)
	}
	if got := e.steps.copied[sha256Hex("alice's bytes")]; got != "alice's bytes" {
		t.Errorf("alice's COPY read %q, want her bytes", got)
	}
	if t0, _ := e.backend.GetTemplate(t.Context(), "app"); t0.Owner != "alice" {
		t.Errorf("template app owner %q, want alice", t0.Owner)
	}

	// The name is alice's now.
	if code, body := e.startAs(bobStepKey, "app", rb.BuildID, copyStep); code != http.StatusForbidden {
		t.Errorf("bob starts his build of alice's app: HTTP %d %s, want 403", code, body)
	}
	if _, code := e.createAs(bobStepKey, "app"); code != http.StatusForbidden {
		t.Errorf("bob creates a build of alice's app: HTTP %d, want 403", code)
	}
	if _, code := e.uploadURL(bobStepKey, "app", hashA); code != http.StatusForbidden {
		t.Errorf("bob's upload URL for alice's app: HTTP %d, want 403", code)
	}
	if got := e.statusAs(bobStepKey, "app", ra.BuildID); got != "" {
		t.Errorf("bob reads alice's build: status %q, want 404", got)
	}
	if code, _ := e.doAs(bobStepKey, "POST", "/templates/tags", wire.AssignTemplateTagsRequest{Target: "app", Tags: []string{"prod"}}, nil); code != http.StatusForbidden {
		t.Errorf("bob tags alice's app: HTTP %d, want 403", code)
	}
	if code, _ := e.doAs(bobStepKey, "DELETE", "/templates/tags", wire.DeleteTemplateTagsRequest{Name: "app", Tags: []string{"default"}}, nil); code != http.StatusForbidden {
		t.Errorf("bob deletes alice's tag: HTTP %d, want 403", code)
	}
	if code, body := e.doAs(aliceStepKey, "POST", "/templates/tags", wire.AssignTemplateTagsRequest{Target: "app", Tags: []string{"prod"}}, nil); code != http.StatusCreated {
		t.Errorf("alice tags her app: HTTP %d %s", code, body)
	}
	// Bob may still build from it.
	rc, _ := e.createAs(bobStepKey, "bobs")
	if code, body := e.doAs(bobStepKey, "POST", "/v2/templates/bobs/builds/"+rc.BuildID, wire.TemplateBuildStartV2{FromTemplate: "app"}, nil); code != http.StatusAccepted {
		t.Errorf("bob builds fromTemplate alice's app: HTTP %d %s", code, body)
	}
	e.waitStatus(bobStepKey, "bobs", rc.BuildID, statusReady)
}

// One key's build of a name neither cancels nor starts beside another
// key's running build of it, and one key holds at most its share of the
// build slots: with two slots, alice's second build waits while bob's
// runs.
func TestStepBuildsPerOwnerCancelAndSlots(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{block: true}, func(c *TemplateBuildsConfig) { c.MaxConcurrent = 2 })
	one, _ := e.createAs(aliceStepKey, "one")
	if code, body := e.startAs(aliceStepKey, "one", one.BuildID); code != http.StatusAccepted {
		t.Fatalf("alice starts one: HTTP %d %s", code, body)
	}
	e.waitStatus(aliceStepKey, "one", one.BuildID, statusBuilding)
	if r, code := e.createAs(bobStepKey, "one"); code != http.StatusForbidden {
		t.Errorf("bob creates a build of the name alice is building: HTTP %d, want 403", code)
		if code == http.StatusAccepted {
			e.startAs(bobStepKey, "one", r.BuildID)
		}
	}
	if got := e.statusAs(aliceStepKey, "one", one.BuildID); got != statusBuilding {
		t.Errorf("alice's build after bob's attempt: %q, want still building", got)
	}

	two, _ := e.createAs(aliceStepKey, "two")
	if code, body := e.startAs(aliceStepKey, "two", two.BuildID); code != http.StatusAccepted {
		t.Fatalf("alice starts two: HTTP %d %s", code, body)
	}
	mine, _ := e.createAs(bobStepKey, "mine")
	if code, body := e.startAs(bobStepKey, "mine", mine.BuildID); code != http.StatusAccepted {
		t.Fatalf("bob starts mine: HTTP %d %s", code, body)
	}
	e.waitStatus(bobStepKey, "mine", mine.BuildID, statusBuilding)
	if got := e.statusAs(aliceStepKey, "two", two.BuildID); got != statusWaiting {
		t.Errorf("alice's second build while her first holds her share: %q, want waiting", got)
	}

	// Her own new build of a name does cancel her running one (E2B's way).
	again, _ := e.createAs(aliceStepKey, "one")
	if code, body := e.startAs(aliceStepKey, "one", again.BuildID); code != http.StatusAccepted {
		t.Fatalf("alice restarts one: HTTP %d %s", code, body)
	}
	e.waitStatus(aliceStepKey, "one", one.BuildID, statusError)
	var info wire.TemplateBuildInfo
	e.doAs(aliceStepKey, "GET", fmt.Sprintf("/templates/one/builds/%s/status", one.BuildID), nil, &info)
	if info.Reason == nil || !strings.Contains(info.Reason.Message, "cancelled") {
		t.Errorf("alice's replaced build: reason %+v, want cancelled", info.Reason)
	}
}

// Concurrent uploads of one hash: exactly one stores it; the others are
// accepted only with the same bytes, and the stored archive and its
// SHA-256 are the first's, whole.
func TestBuildFilesStoreConcurrent(t *testing.T) {
	f, err := openBuildFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	type result struct {
		body    string
		created bool
		err     error
	}
	results := make(chan result, n)
	for i := range n {
		body := "same bytes"
		if i%2 == 1 {
			body = fmt.Sprintf("other bytes %d", i)
		}
		go func() {
			_, created, err := f.store("alice", "app", hashA, strings.NewReader(body), 1<<20, "")
			results <- result{body, created, err}
		}()
	}
	var stored string
	created := 0
	var all []result
	for range n {
		r := <-results
		all = append(all, r)
		if r.created {
			created++
			stored = r.body
		}
	}
	if created != 1 {
		t.Fatalf("%d uploads stored the hash, want 1: %+v", created, all)
	}
	for _, r := range all {
		if r.created {
			continue
		}
		if wantOK := r.body == stored; wantOK != (r.err == nil) {
			t.Errorf("upload of %q after %q was stored: got %v, want ok %v", r.body, stored, r.err, wantOK)
		}
	}
	rc, err := f.open("alice", "app", hashA)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	buf := new(strings.Builder)
	if _, err := io.Copy(buf, rc); err != nil || buf.String() != stored {
		t.Errorf("stored archive %q, %v; want %q", buf.String(), err, stored)
	}
	if d, err := f.digest("alice", "app", hashA); err != nil || d != sha256Hex(stored) {
		t.Errorf("digest %s, %v; want %s", d, err, sha256Hex(stored))
	}
}
