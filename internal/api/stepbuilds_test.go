package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// fakeSteps stands in for internal/imagebuild's Builder (which has its own
// tests with real gVisor build sandboxes): it logs one line per step,
// reads every COPY step's archive through spec.Files, and fails at step
// failAt or waits for its context when block is set.
type fakeSteps struct {
	mu     sync.Mutex
	specs  []imagebuild.Spec
	copied map[string]string // files hash → archive content
	failAt int
	block  bool
	// delay holds each Prepare; inFlight and maxInFlight count them.
	delay       time.Duration
	inFlight    int
	maxInFlight int
	// cleaned counts cleanups run.
	cleaned int
}

func (f *fakeSteps) Prepare(ctx context.Context, spec imagebuild.Spec, log func(imagebuild.LogEntry)) (template.BuildRequest, func(), error) {
	f.mu.Lock()
	f.specs = append(f.specs, spec)
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.mu.Unlock()
	defer func() { f.mu.Lock(); f.inFlight--; f.mu.Unlock() }()
	time.Sleep(f.delay)
	log(imagebuild.LogEntry{Time: time.Now(), Level: "info", Message: "pulled " + spec.FromImage + spec.FromTemplate, Step: "base"})
	for i, st := range spec.Steps {
		n := i + 1
		log(imagebuild.LogEntry{Time: time.Now(), Level: "info", Message: fmt.Sprintf("[builder %d/%d] %s %s", n, len(spec.Steps), st.Type, strings.Join(st.Args, " ")), Step: fmt.Sprint(n)})
		if st.Type == "COPY" {
			r, err := spec.Files(st.FilesHash)
			if err != nil {
				return template.BuildRequest{}, nil, err
			}
			b, _ := io.ReadAll(r)
			r.Close()
			f.mu.Lock()
			if f.copied == nil {
				f.copied = map[string]string{}
			}
			f.copied[st.FilesHash] = string(b)
			f.mu.Unlock()
		}
		if n == f.failAt {
			return template.BuildRequest{}, nil, &imagebuild.StepError{Step: n, Type: st.Type, Command: st.Args[0], Output: "boom: no such thing", Err: errors.New("exit status 3")}
		}
	}
	if f.block {
		<-ctx.Done()
		return template.BuildRequest{}, nil, ctx.Err()
	}
	cleanup := func() { f.mu.Lock(); f.cleaned++; f.mu.Unlock() }
	return template.BuildRequest{Name: spec.Name, Start: template.Start{StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd}}, cleanup, nil
}

// stepBackend keeps templates in a map and builds them at once.
type stepBackend struct {
	service.Backend
	mu        sync.Mutex
	templates map[string]service.TemplateInfo
	built     []template.BuildRequest
}

func (b *stepBackend) GetTemplate(ctx context.Context, name string) (service.TemplateInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.templates[name]
	if !ok {
		return service.TemplateInfo{}, errdefs.NotFound("template %q not found", name)
	}
	return t, nil
}

func (b *stepBackend) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	progress(template.Progress{Phase: "image", Percent: 50, Message: "erofs"})
	b.mu.Lock()
	defer b.mu.Unlock()
	b.built = append(b.built, req)
	t := service.TemplateInfo{Template: template.Template{Name: req.Name, EnvdHash: "h", Owner: req.Owner}}
	b.templates[req.Name] = t
	return t, nil
}

type stepEnv struct {
	t       *testing.T
	srv     *httptest.Server
	steps   *fakeSteps
	backend *stepBackend
	builds  *TemplateBuilds
}

func newStepEnv(t *testing.T, steps *fakeSteps, change func(*TemplateBuildsConfig)) *stepEnv {
	cfg := TemplateBuildsConfig{FilesDir: t.TempDir()}
	if steps != nil {
		cfg.Steps = steps
	}
	if change != nil {
		change(&cfg)
	}
	tb, err := NewTemplateBuilds(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.Close)
	be := &stepBackend{templates: map[string]service.TemplateInfo{"base": {Template: template.Template{Name: "base"}}}}
	srv := httptest.NewServer(New(Config{APIKey: "k", APIKeys: map[string]string{aliceStepKey: "alice", bobStepKey: "bob"}, Backend: be, TemplateBuilds: tb}).Handler())
	t.Cleanup(srv.Close)
	return &stepEnv{t: t, srv: srv, steps: steps, backend: be, builds: tb}
}

// Named keys of the step build tests.
const (
	aliceStepKey = "alice-key-0123456789"
	bobStepKey   = "bob-key-0123456789ab"
)

// do sends a request with the single API key (unless url is absolute) and
// decodes a JSON answer into out; it returns the status and the raw body.
func (e *stepEnv) do(method, path string, body any, out any) (int, string) {
	e.t.Helper()
	return e.doAs("k", method, path, body, out)
}

// doAs is do with the API key key.
func (e *stepEnv) doAs(key, method, path string, body any, out any) (int, string) {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	url := path
	if !strings.HasPrefix(path, "http") {
		url = e.srv.URL + path
	}
	req, _ := http.NewRequest(method, url, rd)
	if !strings.HasPrefix(path, "http") {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			e.t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
	return resp.StatusCode, string(raw)
}

func (e *stepEnv) create(name string) wire.TemplateRequestResponseV3 {
	e.t.Helper()
	var out wire.TemplateRequestResponseV3
	if code, body := e.do("POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name}, &out); code != http.StatusAccepted {
		e.t.Fatalf("POST /v3/templates %q: HTTP %d %s", name, code, body)
	}
	return out
}

// upload runs the SDK's handshake for one archive.
func (e *stepEnv) upload(templateID, hash, content string) {
	e.t.Helper()
	var fu wire.TemplateBuildFileUpload
	if code, body := e.do("GET", "/templates/"+templateID+"/files/"+hash, nil, &fu); code != http.StatusCreated || fu.URL == "" {
		e.t.Fatalf("files handshake: HTTP %d %s", code, body)
	}
	if !strings.HasPrefix(fu.URL, e.srv.URL+"/") {
		e.t.Fatalf("upload URL %q is not an absolute URL on this server %s", fu.URL, e.srv.URL)
	}
	if fu.Present {
		return
	}
	// Behind a proxy that ends TLS, the URL says https.
	req, _ := http.NewRequest("GET", e.srv.URL+"/templates/"+templateID+"/files/"+hash, nil)
	req.Header.Set("X-API-Key", "k")
	req.Header.Set("X-Forwarded-Proto", "https")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		var viaProxy wire.TemplateBuildFileUpload
		json.NewDecoder(resp.Body).Decode(&viaProxy)
		resp.Body.Close()
		if !strings.HasPrefix(viaProxy.URL, "https://") {
			e.t.Errorf("upload URL behind a TLS proxy = %q, want https", viaProxy.URL)
		}
	}
	if code, body := e.do("PUT", fu.URL, content, nil); code != http.StatusCreated && code != http.StatusOK {
		e.t.Fatalf("PUT upload: HTTP %d %s", code, body)
	}
}

// wait polls the status as the SDK does (offset grows by what each poll
// returned; after the end, until a poll returns nothing) and returns the
// last answer and the whole log.
func (e *stepEnv) wait(templateID, buildID string) (wire.TemplateBuildInfo, []wire.BuildLogEntry) {
	e.t.Helper()
	var all []wire.BuildLogEntry
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var info wire.TemplateBuildInfo
		path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", templateID, buildID, len(all))
		if code, body := e.do("GET", path, nil, &info); code != http.StatusOK {
			e.t.Fatalf("status: HTTP %d %s", code, body)
		}
		if info.LogEntries == nil || info.Logs == nil {
			e.t.Fatalf("status answer has null logEntries or logs (the SDK maps over them): %+v", info)
		}
		all = append(all, info.LogEntries...)
		if (info.Status == statusReady || info.Status == statusError) && len(info.LogEntries) == 0 {
			return info, all
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("build %s did not end", buildID)
	return wire.TemplateBuildInfo{}, nil
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

var (
	hashA = strings.Repeat("a", 64)
	hashB = strings.Repeat("b", 64)
)

func TestStepBuildEndToEnd(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, nil)
	r := e.create("App:v1")
	if r.TemplateID != "app" || r.BuildID == "" || len(r.Tags) != 1 || r.Tags[0] != "v1" {
		t.Fatalf("create answered %+v, want templateID app, a build ID and tags [v1]", r)
	}
	// Status before the start: waiting, with empty arrays.
	var info wire.TemplateBuildInfo
	e.do("GET", "/templates/app/builds/"+r.BuildID+"/status", nil, &info)
	if info.Status != statusWaiting {
		t.Fatalf("status before start = %q, want waiting", info.Status)
	}
	e.upload("app", hashA, "archive-a")
	start := wire.TemplateBuildStartV2{FromImage: "127.0.0.1:5000/img:1", StartCmd: "run", ReadyCmd: "[ -f /r ]", Steps: []wire.TemplateStep{
		{Type: "RUN", Args: []string{"echo hi > /usr/local/bin/x", "root"}},
		{Type: "COPY", Args: []string{"files", "/app", "", "0755"}, FilesHash: hashA},
		{Type: "ENV", Args: []string{"A", "1"}},
		{Type: "WORKDIR", Args: []string{"/app"}},
		{Type: "USER", Args: []string{"app"}},
	}}
	if code, body := e.do("POST", "/v2/templates/app/builds/"+r.BuildID, start, nil); code != http.StatusAccepted {
		t.Fatalf("start: HTTP %d %s", code, body)
	}
	info, log := e.wait("app", r.BuildID)
	if info.Status != statusReady || info.Reason != nil {
		t.Fatalf("build ended %q (%+v), want ready", info.Status, info.Reason)
	}
	if !strings.Contains(log[len(log)-1].Message, "Build finished") {
		t.Errorf("last log line %q, want Build finished", log[len(log)-1].Message)
	}
	spec := e.steps.specs[0]
	if spec.Name != "app" || spec.FromImage != start.FromImage || len(spec.Steps) != 5 || spec.StartCmd != "run" || spec.ReadyCmd != "[ -f /r ]" {
		t.Errorf("builder got %+v", spec)
	}
	// The builder sees the files by the server's hash of their bytes.
	if got := e.steps.copied[sha256Hex("archive-a")]; got != "archive-a" {
		t.Errorf("COPY archive read through Spec.Files by its SHA-256 = %q, want the uploaded bytes (read: %v)", got, e.steps.copied)
	}
	if len(e.backend.built) != 1 || e.backend.built[0].StartCmd != "run" || e.steps.cleaned != 1 {
		t.Errorf("template built %d times (want 1, with the start command) and cleanups %d (want 1)", len(e.backend.built), e.steps.cleaned)
	}
	// A rebuild of the same alias: same template, the file is present.
	r2 := e.create("app")
	if r2.TemplateID != "app" || r2.BuildID == r.BuildID {
		t.Fatalf("rebuild: %+v", r2)
	}
	var fu wire.TemplateBuildFileUpload
	e.do("GET", "/templates/app/files/"+hashA, nil, &fu)
	if !fu.Present {
		t.Errorf("an uploaded archive is not present for the rebuild")
	}
	// Aliases and tags.
	var alias wire.TemplateAliasResponse
	if code, _ := e.do("GET", "/templates/aliases/app", nil, &alias); code != 200 || alias.TemplateID != "app" {
		t.Errorf("alias of app: HTTP %d %+v", code, alias)
	}
	if code, _ := e.do("GET", "/templates/aliases/nope", nil, nil); code != 404 {
		t.Errorf("alias of an unknown template: HTTP %d, want 404", code)
	}
	// With a tag: the template's tags exist, others do not (a caller
	// that builds what is missing builds a new tag too).
	for alias, want := range map[string]int{"app:v1": 200, "app:default": 200, "app:v2": 404} {
		if code, body := e.do("GET", "/templates/aliases/"+alias, nil, nil); code != want {
			t.Errorf("alias %s: HTTP %d %s, want %d", alias, code, body, want)
		}
	}
	var tags []wire.TemplateTag
	e.do("GET", "/templates/app/tags", nil, &tags)
	if len(tags) != 1 || tags[0].Tag != "v1" || tags[0].BuildID != r.BuildID {
		t.Errorf("tags = %+v, want v1 → %s", tags, r.BuildID)
	}
	var assigned wire.AssignedTemplateTags
	if code, body := e.do("POST", "/templates/tags", wire.AssignTemplateTagsRequest{Target: "app:v1", Tags: []string{"prod"}}, &assigned); code != 201 || assigned.BuildID != r.BuildID {
		t.Errorf("assign tags: HTTP %d %s", code, body)
	}
	srv := New(Config{TemplateBuilds: e.builds})
	for name, want := range map[string]string{"app:prod": "app", "app:default": "app", "app:nope": "app:nope", "app": "app"} {
		if got := srv.resolveTag(name); got != want {
			t.Errorf("create from %q resolves to %q, want %q", name, got, want)
		}
	}
	if code, body := e.do("DELETE", "/templates/tags", wire.DeleteTemplateTagsRequest{Name: "app", Tags: []string{"prod"}}, nil); code != 204 {
		t.Errorf("delete tag: HTTP %d %s", code, body)
	}
	if code, _ := e.do("DELETE", "/templates/tags", wire.DeleteTemplateTagsRequest{Name: "app", Tags: []string{"prod"}}, nil); code != 404 {
		t.Errorf("delete of a missing tag: HTTP %d, want 404", code)
	}
	if code, _ := e.do("GET", "/templates/app/other", nil, nil); code != 404 {
		t.Errorf("GET /templates/app/other: HTTP %d, want 404", code)
	}
}

func TestStepBuildLogOffsets(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, nil)
	r := e.create("logs")
	steps := []wire.TemplateStep{{Type: "RUN", Args: []string{"true"}}, {Type: "ENV", Args: []string{"A", "1"}}}
	e.do("POST", "/v2/templates/logs/builds/"+r.BuildID, wire.TemplateBuildStartV2{FromTemplate: "base", Steps: steps}, nil)
	_, all := e.wait("logs", r.BuildID)
	for off := range len(all) + 1 {
		var info wire.TemplateBuildInfo
		e.do("GET", fmt.Sprintf("/templates/logs/builds/%s/status?logsOffset=%d&limit=1", r.BuildID, off), nil, &info)
		want := min(1, len(all)-off)
		if len(info.LogEntries) != want || (want == 1 && info.LogEntries[0] != all[off]) {
			t.Fatalf("offset %d limit 1: got %+v, want entry %d of the log", off, info.LogEntries, off)
		}
	}
	var info wire.TemplateBuildInfo
	e.do("GET", "/templates/logs/builds/"+r.BuildID+"/status?level=error", nil, &info)
	if len(info.LogEntries) != 0 {
		t.Errorf("level=error of a good build: %+v", info.LogEntries)
	}
	if code, _ := e.do("GET", "/templates/logs/builds/"+r.BuildID+"/status?logsOffset=-1", nil, nil); code != 400 {
		t.Errorf("negative offset: HTTP %d, want 400", code)
	}
	// The time-cursor route: forward from the start is the whole log (up
	// to 100), backward is it reversed; a cursor past the end gives none.
	var fw, bw, none wire.TemplateBuildLogsResponse
	e.do("GET", "/templates/logs/builds/"+r.BuildID+"/logs", nil, &fw)
	e.do("GET", "/templates/logs/builds/"+r.BuildID+"/logs?direction=backward", nil, &bw)
	e.do("GET", fmt.Sprintf("/templates/logs/builds/%s/logs?cursor=%d", r.BuildID, time.Now().Add(time.Hour).UnixMilli()), nil, &none)
	if len(fw.Logs) != len(all) || len(bw.Logs) != len(all) || len(none.Logs) != 0 {
		t.Fatalf("logs route: forward %d, backward %d, past the end %d entries; want %d, %d, 0", len(fw.Logs), len(bw.Logs), len(none.Logs), len(all), len(all))
	}
	for i := range all {
		if fw.Logs[i] != all[i] || bw.Logs[len(all)-1-i] != all[i] {
			t.Fatalf("logs route entry %d: forward %+v, backward %+v, want %+v", i, fw.Logs[i], bw.Logs[len(all)-1-i], all[i])
		}
	}
	if code, _ := e.do("GET", "/templates/logs/builds/"+r.BuildID+"/logs?direction=up", nil, nil); code != 400 {
		t.Errorf("direction=up: HTTP %d, want 400", code)
	}
	if code, _ := e.do("GET", "/templates/logs/builds/nope/status", nil, nil); code != 404 {
		t.Errorf("unknown build: HTTP %d, want 404", code)
	}
	if code, _ := e.do("GET", "/templates/other/builds/"+r.BuildID+"/status", nil, nil); code != 404 {
		t.Errorf("a build under another template: HTTP %d, want 404", code)
	}
}

func TestStepBuildFailingStep(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{failAt: 2}, nil)
	r := e.create("bad")
	steps := []wire.TemplateStep{{Type: "ENV", Args: []string{"A", "1"}}, {Type: "RUN", Args: []string{"exit 3"}}, {Type: "RUN", Args: []string{"true"}}}
	e.do("POST", "/v2/templates/bad/builds/"+r.BuildID, wire.TemplateBuildStartV2{FromImage: "img", Steps: steps}, nil)
	info, _ := e.wait("bad", r.BuildID)
	if info.Status != statusError || info.Reason == nil {
		t.Fatalf("build ended %q with reason %+v, want error", info.Status, info.Reason)
	}
	for _, want := range []string{"step 2", "exit 3", "boom: no such thing"} {
		if !strings.Contains(info.Reason.Message, want) {
			t.Errorf("reason %q lacks %q", info.Reason.Message, want)
		}
	}
	if info.Reason.Step != "2" {
		t.Errorf("reason.step = %q, want 2", info.Reason.Step)
	}
	if len(e.backend.built) != 0 {
		t.Errorf("a failed build made a template")
	}
}

func TestStepBuildNewBuildCancelsRunning(t *testing.T) {
	steps := &fakeSteps{block: true}
	e := newStepEnv(t, steps, nil)
	first := e.create("same")
	e.do("POST", "/v2/templates/same/builds/"+first.BuildID, wire.TemplateBuildStartV2{FromImage: "img"}, nil)
	second := e.create("same")
	// The second build waits for the first to end: unblock it after the
	// first is cancelled.
	if code, body := e.do("POST", "/v2/templates/same/builds/"+second.BuildID, wire.TemplateBuildStartV2{FromImage: "img"}, nil); code != http.StatusAccepted {
		t.Fatalf("second start: HTTP %d %s", code, body)
	}
	info, _ := e.wait("same", first.BuildID)
	if info.Status != statusError || !strings.Contains(info.Reason.Message, second.BuildID) {
		t.Fatalf("first build: %q %+v, want error naming build %s", info.Status, info.Reason, second.BuildID)
	}
	e.builds.Close() // cancels the second (blocked) one too
	info, _ = e.wait("same", second.BuildID)
	if info.Status != statusError {
		t.Fatalf("second build after Close: %q", info.Status)
	}
	// Starting a started build again is refused.
	if code, _ := e.do("POST", "/v2/templates/same/builds/"+first.BuildID, wire.TemplateBuildStartV2{FromImage: "img"}, nil); code != 400 && code != 503 {
		t.Errorf("restart of a finished build: HTTP %d, want 400", code)
	}
}

func TestStepBuildBadInput(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, func(c *TemplateBuildsConfig) { c.MaxUploadBytes = 10 })
	for _, name := range []string{"", "team/app", "App:Bad Tag", "-x"} {
		if code, _ := e.do("POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name}, nil); code != 400 {
			t.Errorf("create %q: HTTP %d, want 400", name, code)
		}
	}
	if code, _ := e.do("POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: "ok", MemoryMB: 5}, nil); code != 400 {
		t.Errorf("memoryMB 5: HTTP %d, want 400", code)
	}
	r := e.create("in")
	if code, _ := e.do("GET", "/templates/in/files/xyz", nil, nil); code != 400 {
		t.Errorf("bad hash: HTTP %d, want 400", code)
	}
	if code, _ := e.do("GET", "/templates/unknown/files/"+hashA, nil, nil); code != 404 {
		t.Errorf("files of an unknown template: HTTP %d, want 404", code)
	}
	var fu wire.TemplateBuildFileUpload
	e.do("GET", "/templates/in/files/"+hashA, nil, &fu)
	if code, _ := e.do("PUT", strings.Replace(fu.URL, hashA, hashB, 1), "x", nil); code != 401 {
		t.Errorf("PUT with the token of another hash: HTTP %d, want 401", code)
	}
	if code, _ := e.do("PUT", e.srv.URL+"/templates/in/files/"+hashA, "x", nil); code != 401 {
		t.Errorf("PUT without a token: HTTP %d, want 401", code)
	}
	if code, _ := e.do("PUT", fu.URL, "more than ten bytes", nil); code != 413 {
		t.Errorf("PUT above the limit: HTTP %d, want 413", code)
	}
	if e.builds.files.present("", "in", hashA) {
		t.Errorf("a refused upload left the archive present")
	}
	cases := []struct {
		name string
		body string
	}{
		{"no source", `{"steps":[]}`},
		{"both sources", `{"fromImage":"a","fromTemplate":"base"}`},
		{"unknown template", `{"fromTemplate":"nope"}`},
		{"unknown step", `{"fromImage":"a","steps":[{"type":"ADD","args":["a","b"]}]}`},
		{"empty RUN", `{"fromImage":"a","steps":[{"type":"RUN","args":[]}]}`},
		{"odd ENV", `{"fromImage":"a","steps":[{"type":"ENV","args":["A"]}]}`},
		{"COPY not uploaded", `{"fromImage":"a","steps":[{"type":"COPY","args":["f","/f"],"filesHash":"` + hashB + `"}]}`},
		{"COPY bad mode", `{"fromImage":"a","steps":[{"type":"COPY","args":["f","/f","","rwx"],"filesHash":"` + hashB + `"}]}`},
		{"aws registry", `{"fromImage":"a","fromImageRegistry":{"type":"aws","awsAccessKeyId":"x"}}`},
		{"malformed", `{"fromImage":`},
	}
	for _, c := range cases {
		if code, body := e.do("POST", "/v2/templates/in/builds/"+r.BuildID, c.body, nil); code != 400 {
			t.Errorf("%s: HTTP %d %s, want 400", c.name, code, body)
		}
	}
	// Unknown fields (the SDK's COPY hints) are ignored.
	ok := `{"fromImage":"a","force":false,"steps":[{"type":"RUN","args":["true"],"force":false,"gzip":true}],"extra":1}`
	if code, body := e.do("POST", "/v2/templates/in/builds/"+r.BuildID, ok, nil); code != 202 {
		t.Errorf("a body with unknown fields: HTTP %d %s, want 202", code, body)
	}
	if info, _ := e.wait("in", r.BuildID); info.Status != statusReady {
		t.Errorf("build with unknown fields ended %q", info.Status)
	}
}

func TestStepBuildsDisabled(t *testing.T) {
	srv := httptest.NewServer(New(Config{APIKey: "k", Backend: &stepBackend{templates: map[string]service.TemplateInfo{}}}).Handler())
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v3/templates", strings.NewReader(`{"name":"x"}`))
	req.Header.Set("X-API-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "not enabled") {
		t.Fatalf("without a step builder: HTTP %d %s, want 503 not enabled", resp.StatusCode, body)
	}
}

func TestStepBuildRecordsBounded(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, func(c *TemplateBuildsConfig) { c.MaxRecords = 3 })
	var ids []string
	for i := range 5 {
		ids = append(ids, e.create(fmt.Sprintf("t%d", i)).BuildID)
	}
	for i, id := range ids {
		code, _ := e.do("GET", fmt.Sprintf("/templates/t%d/builds/%s/status", i, id), nil, nil)
		if want := map[bool]int{true: 404, false: 200}[i < 2]; code != want {
			t.Errorf("build %d of 5 with room for 3: HTTP %d, want %d", i, code, want)
		}
	}
}

// Many builds at once, each polled as the SDK does: all end ready, and no
// more than MaxConcurrent run at a time.
func TestStepBuildsConcurrent(t *testing.T) {
	steps := &fakeSteps{delay: 20 * time.Millisecond}
	e := newStepEnv(t, steps, func(c *TemplateBuildsConfig) { c.MaxConcurrent = 2 })
	var wg sync.WaitGroup
	errs := make(chan string, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("c%d", i%4) // three builds per template: later ones cancel earlier
			var r wire.TemplateRequestResponseV3
			if code, body := e.do("POST", "/v3/templates", wire.TemplateBuildRequestV3{Name: name}, &r); code != 202 {
				errs <- fmt.Sprintf("create %s: HTTP %d %s", name, code, body)
				return
			}
			if code, body := e.do("POST", "/v2/templates/"+name+"/builds/"+r.BuildID, wire.TemplateBuildStartV2{FromImage: "img", Steps: []wire.TemplateStep{{Type: "RUN", Args: []string{"true"}}}}, nil); code != 202 {
				errs <- fmt.Sprintf("start %s: HTTP %d %s", name, code, body)
				return
			}
			info, _ := e.wait(name, r.BuildID)
			if info.Status != statusReady && (info.Reason == nil || !strings.Contains(info.Reason.Message, "cancelled")) {
				errs <- fmt.Sprintf("build of %s ended %s: %+v", name, info.Status, info.Reason)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if steps.maxInFlight > 2 {
		t.Errorf("%d builds ran at once, want at most MaxConcurrent 2", steps.maxInFlight)
	}
	for i := range 4 {
		if _, err := e.backend.GetTemplate(context.Background(), fmt.Sprintf("c%d", i)); err != nil {
			t.Errorf("template c%d was never built: %v", i, err)
		}
	}
}
