package sandboxfusion

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// noSandboxes is a backend whose runner template is missing and cannot be
// built: every call must answer SandboxError without creating anything.
type noSandboxes struct{}

func (noSandboxes) Create(context.Context, sandbox.CreateRequest) (sandbox.Sandbox, error) {
	return sandbox.Sandbox{}, errors.New("no creates in this test")
}
func (noSandboxes) Kill(context.Context, string) error { return nil }
func (noSandboxes) GetTemplate(context.Context, string) (service.TemplateInfo, error) {
	return service.TemplateInfo{}, errdefs.NotFound("template")
}
func (noSandboxes) BuildTemplate(context.Context, template.BuildRequest, func(template.Progress)) (service.TemplateInfo, error) {
	return service.TemplateInfo{}, errdefs.Unavailable("no builds in this test")
}

func TestCheckNeedsKeyOffLoopback(t *testing.T) {
	for _, tc := range []struct {
		listen, key string
		ok          bool
	}{
		{"127.0.0.1:8080", "", true},
		{"[::1]:8080", "", true},
		{"localhost:8080", "", true},
		{"0.0.0.0:8080", "", false},
		{":8080", "", false},
		{"10.0.0.5:8080", "", false},
		{"0.0.0.0:8080", "k", true},
		{"8080", "", false},
	} {
		err := Config{Listen: tc.listen, Key: tc.key}.Check()
		if (err == nil) != tc.ok {
			t.Errorf("Check(listen %q, key %q) = %v, want ok %v", tc.listen, tc.key, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Check(listen %q): %v, want ErrInvalid", tc.listen, err)
		}
	}
}

func TestKey(t *testing.T) {
	s := New(t.Context(), Config{Key: "sekrit"}, noSandboxes{}, "http://127.0.0.1:1", nil)
	h := s.Handler()
	for _, tc := range []struct {
		name, path string
		header     map[string]string
		want       int
	}{
		{"none", "/v1/ping", nil, http.StatusUnauthorized},
		{"wrong header", "/v1/ping", map[string]string{"X-API-Key": "nope"}, http.StatusUnauthorized},
		{"header", "/v1/ping", map[string]string{"X-API-Key": "sekrit"}, http.StatusOK},
		{"bearer", "/v1/ping", map[string]string{"Authorization": "Bearer sekrit"}, http.StatusOK},
		{"path", "/sekrit/v1/ping", nil, http.StatusOK},
		{"wrong path", "/sekri/v1/ping", nil, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest("GET", tc.path, nil)
		for k, v := range tc.header {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("%s: GET %s: HTTP %d, want %d", tc.name, tc.path, w.Code, tc.want)
		}
	}
}

func TestCallsBeforeTheTemplateIsReady(t *testing.T) {
	s := New(t.Context(), Config{}, noSandboxes{}, "http://127.0.0.1:1", nil)
	s.Wait() // the build failed: the service says so on every call
	for _, tc := range []struct{ lang, want string }{
		{"python", "build the runner template"},
		{"fortran", `language "fortran" is not supported`},
		{"", "no language given"},
	} {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/run_code", strings.NewReader(`{"code":"x","language":"`+tc.lang+`"}`)))
		var resp RunCodeResponse
		if err := json.NewDecoder(w.Body).Decode(&resp); err != nil || w.Code != http.StatusOK {
			t.Fatalf("language %q: HTTP %d, %v", tc.lang, w.Code, err)
		}
		if resp.Status != SandboxError || !strings.Contains(resp.Message, tc.want) {
			t.Errorf("language %q: got %s %q, want SandboxError saying %q", tc.lang, resp.Status, resp.Message, tc.want)
		}
	}
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/run_code", strings.NewReader(`{"code": 1}`)))
	if w.Code != http.StatusUnprocessableEntity {
		t.Errorf("a body of the wrong shape: HTTP %d, want 422", w.Code)
	}
}

func TestOutcome(t *testing.T) {
	zero, one := 0, 1
	fin := func(code *int) *CommandResult { return &CommandResult{Status: Finished, ReturnCode: code} }
	msg := "it broke"
	for _, tc := range []struct {
		name         string
		compile, run *CommandResult
		want         Status
	}{
		{"ran", nil, fin(&zero), Success},
		{"compiled and ran", fin(&zero), fin(&zero), Success},
		{"exit 1", nil, fin(&one), Failed},
		{"compile error", fin(&one), nil, Failed},
		{"time limit", nil, &CommandResult{Status: TimeLimitExceeded}, Failed},
		{"error", nil, &CommandResult{Status: CommandError, Stderr: &msg}, SandboxError},
	} {
		if got, _ := outcome(tc.compile, tc.run); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestRunLineLimitsMemory(t *testing.T) {
	for _, tc := range []struct {
		lang string
		mem  int
		want string
	}{
		{"python", -1, "/usr/bin/python3 main.py"},
		{"python", 100, "/usr/bin/prlimit --as=104857600 -- /usr/bin/python3 main.py"},
		{"nodejs", 100, "/usr/bin/node --max-old-space-size=100 main.js"},
		{"cpp", 1, "/usr/bin/prlimit --as=1048576 -- /tmp/code/main"},
	} {
		if got := strings.Join(runArgv(languages[tc.lang], tc.mem), " "); got != tc.want {
			t.Errorf("runArgv(%s, %d) = %q, want %q", tc.lang, tc.mem, got, tc.want)
		}
	}
}
