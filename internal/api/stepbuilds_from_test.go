package api

import (
	"net/http"
	"strings"
	"testing"

	wire "github.com/agentenv/agentenv/client/api"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// A Dockerfile's FROM (E2B's SDKs send it as fromImage) that names a
// template the caller may build on starts from that template, as Docker
// uses a local image before pulling: the operator's templates and the
// caller's own, by a bare name with no tag, "latest", "default" or one of
// the template's tags. Another key's template never does (its name would
// otherwise capture every key's FROM of that name), nor a reference with a
// registry, a path, a digest, or registry credentials: those are pulled.
func TestStepBuildFromImageNamesTemplate(t *testing.T) {
	e := newStepEnv(t, &fakeSteps{}, nil)
	for name, owner := range map[string]string{"python": "", "alicebox": "alice", "bobbox": "bob"} {
		e.backend.templates[name] = service.TemplateInfo{Template: template.Template{Name: name, Owner: owner}}
	}
	if err := e.builds.files.setTags("python", "b-python", []string{"3.12-local"}); err != nil {
		t.Fatal(err)
	}
	creds := &wire.FromImageRegistry{Type: "registry", Username: "u", Password: "p"}
	cases := []struct {
		key, from string
		creds     *wire.FromImageRegistry
		// template is what the build starts from ("": the image is pulled).
		template string
	}{
		{aliceStepKey, "base", nil, "base"},
		{aliceStepKey, "base:latest", nil, "base"},
		{aliceStepKey, "base:default", nil, "base"},
		{aliceStepKey, "alicebox", nil, "alicebox"},
		{aliceStepKey, "bobbox", nil, ""},
		{bobStepKey, "bobbox", nil, "bobbox"},
		{"k", "bobbox", nil, ""},
		{"k", "base", nil, "base"},
		{aliceStepKey, "python:3.12", nil, ""},
		{aliceStepKey, "python:3.12-local", nil, "python"},
		{aliceStepKey, "docker.io/library/base", nil, ""},
		{aliceStepKey, "library/base", nil, ""},
		{aliceStepKey, "base@sha256:" + strings.Repeat("0", 64), nil, ""},
		{aliceStepKey, "base", creds, ""},
		{aliceStepKey, "nosuchtemplate", nil, ""},
	}
	for i, c := range cases {
		name := "from-" + string(rune('a'+i))
		r, code := e.createAs(c.key, name)
		if code != http.StatusAccepted {
			t.Fatalf("create %s: HTTP %d", name, code)
		}
		start := wire.TemplateBuildStartV2{FromImage: c.from, FromImageRegistry: c.creds, Steps: []wire.TemplateStep{{Type: "RUN", Args: []string{"true"}}}}
		if code, body := e.doAs(c.key, "POST", "/v2/templates/"+name+"/builds/"+r.BuildID, start, nil); code != http.StatusAccepted {
			t.Fatalf("start %s FROM %s: HTTP %d %s", name, c.from, code, body)
		}
		e.waitStatus(c.key, name, r.BuildID, statusReady)
		e.steps.mu.Lock()
		spec := e.steps.specs[len(e.steps.specs)-1]
		e.steps.mu.Unlock()
		wantImage := c.from
		if c.template != "" {
			wantImage = ""
		}
		if spec.FromTemplate != c.template || spec.FromImage != wantImage {
			t.Errorf("FROM %s by key %s: builder got fromTemplate %q, fromImage %q; want fromTemplate %q, fromImage %q",
				c.from, c.key, spec.FromTemplate, spec.FromImage, c.template, wantImage)
		}
		if c.template != "" {
			var info wire.TemplateBuildInfo
			e.doAs(c.key, "GET", "/templates/"+name+"/builds/"+r.BuildID+"/status", nil, &info)
			if len(info.LogEntries) == 0 || !strings.Contains(info.LogEntries[0].Message, "the template "+c.template+" on this server") {
				t.Errorf("FROM %s: the build's first log line does not say the template stands for the image: %+v", c.from, info.LogEntries)
			}
		}
	}
}
