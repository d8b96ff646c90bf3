package codeinterp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
)

// hostPython is Debian's interpreter, where make setup installs ipykernel
// (python3-ipykernel); a python3 earlier on PATH may lack it.
const hostPython = "/usr/bin/python3"

// newTestServer serves a Server whose kernels run on the host (the
// protocol and kernel handling, without a sandbox around them).
func newTestServer(t *testing.T) (*httptest.Server, *Server) {
	t.Helper()
	if err := exec.Command(hostPython, "-c", "import ipykernel").Run(); err != nil {
		if testenv.Required() {
			t.Fatalf("%s has no ipykernel: make setup installs python3-ipykernel", hostPython)
		}
		t.Skipf("skipping: %s has no ipykernel (make setup installs python3-ipykernel)", hostPython)
	}
	s, err := New(Config{Python: hostPython, StateDir: t.TempDir(), Cwd: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return hs, s
}

// execute posts a cell and returns its lines.
func execute(t *testing.T, ctx context.Context, url string, body map[string]any) ([]map[string]any, error) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/execute", strings.NewReader(string(b)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /execute %s: got %s %s, want 200", b, resp.Status, msg)
	}
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines, sc.Err()
}

func run(t *testing.T, url string, body map[string]any) []map[string]any {
	t.Helper()
	lines, err := execute(t, context.Background(), url, body)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(lines); n == 0 || lines[n-1]["type"] != "end_of_execution" {
		t.Fatalf("got lines %v, want end_of_execution last", lines)
	}
	return lines
}

func mainText(lines []map[string]any) string {
	for _, l := range lines {
		if l["type"] == "result" && l["is_main_result"] == true {
			s, _ := l["text"].(string)
			return s
		}
	}
	return ""
}

func ofType(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// The kernel keeps state across cells; stdout, stderr, errors and the
// execution count arrive as the SDKs expect.
func TestExecuteKeepsStateAndStreams(t *testing.T) {
	hs, _ := newTestServer(t)
	run(t, hs.URL, map[string]any{"code": "x = 41"})
	lines := run(t, hs.URL, map[string]any{"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx + 1"})
	if got := mainText(lines); got != "42" {
		t.Errorf("x + 1: got main result %q, want 42 (lines %v)", got, lines)
	}
	if o := ofType(lines, "stdout"); len(o) != 1 || o[0]["text"] != "out\n" || o[0]["timestamp"] == nil {
		t.Errorf("got stdout lines %v, want one \"out\\n\" with a timestamp", o)
	}
	if e := ofType(lines, "stderr"); len(e) != 1 || e[0]["text"] != "err\n" {
		t.Errorf("got stderr lines %v, want one \"err\\n\"", e)
	}
	if c := ofType(lines, "number_of_executions"); len(c) != 1 || c[0]["execution_count"] != 2.0 {
		t.Errorf("got execution counts %v, want 2", c)
	}
	lines = run(t, hs.URL, map[string]any{"code": "def f():\n    raise ValueError('bad')\nf()"})
	errs := ofType(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad" ||
		!strings.Contains(errs[0]["traceback"].(string), "raise ValueError") {
		t.Errorf("got errors %v, want one ValueError 'bad' whose traceback shows the raise", errs)
	}
	lines = run(t, hs.URL, map[string]any{"code": "import os\nos.environ.get('CI_VAR')", "env_vars": map[string]string{"CI_VAR": "v1"}})
	if got := mainText(lines); got != "v1" {
		t.Errorf("env_vars CI_VAR: got %q, want v1", got)
	}
	lines = run(t, hs.URL, map[string]any{"code": "print(os.environ.get('CI_VAR'))"})
	if o := ofType(lines, "stdout"); len(o) != 1 || o[0]["text"] != "None\n" {
		t.Errorf("CI_VAR after its cell: got %v, want unset (None)", o)
	}
}

// A cell whose client goes away is interrupted, and the context runs the
// next cell with its variables intact.
func TestDisconnectInterruptsCell(t *testing.T) {
	hs, _ := newTestServer(t)
	run(t, hs.URL, map[string]any{"code": "y = 7"})
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if _, err := execute(t, ctx, hs.URL, map[string]any{"code": "import time\nwhile True:\n    time.sleep(0.05)"}); err == nil {
		t.Fatal("an endless cell ended without its client leaving")
	}
	lines := run(t, hs.URL, map[string]any{"code": "y * 6"})
	if got := mainText(lines); got != "42" {
		t.Errorf("after the interrupted cell: got %q, want 42 (lines %v)", got, lines)
	}
}

// A cell sent right after one that raised runs: the kernel's abort
// window after an error must not swallow it.
func TestCellAfterErrorRuns(t *testing.T) {
	hs, _ := newTestServer(t)
	for i := range 30 {
		run(t, hs.URL, map[string]any{"code": "raise ValueError('bad')"})
		lines := run(t, hs.URL, map[string]any{"code": fmt.Sprintf("%d * 2", i)})
		if got := mainText(lines); got != fmt.Sprint(i*2) {
			t.Fatalf("cell %d after an error: got %q, want %d (lines %v)", i, got, i*2, lines)
		}
	}
}

// Contexts are separate kernels in their own directories; a restart
// forgets variables and a removed context is gone.
func TestContexts(t *testing.T) {
	hs, _ := newTestServer(t)
	dir := t.TempDir()
	resp, err := http.Post(hs.URL+"/contexts", "application/json", strings.NewReader(`{"language":"python","cwd":"`+dir+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	var c codeContext
	json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if resp.StatusCode != 200 || c.ID == "" || c.Cwd != dir || c.Language != "python" {
		t.Fatalf("POST /contexts: got %s %+v, want 200 with an id, cwd %s", resp.Status, c, dir)
	}
	run(t, hs.URL, map[string]any{"code": "z = 1"})
	lines := run(t, hs.URL, map[string]any{"code": "import os\nprint(os.getcwd())\n'z' in dir()", "context_id": c.ID})
	if o := ofType(lines, "stdout"); len(o) != 1 || o[0]["text"] != dir+"\n" {
		t.Errorf("cwd of the new context: got %v, want %s", o, dir)
	}
	if got := mainText(lines); got != "False" {
		t.Errorf("the default context's z in the new context: got %q, want False", got)
	}
	var list []codeContext
	resp, _ = http.Get(hs.URL + "/contexts")
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 2 {
		t.Errorf("GET /contexts: got %d contexts, want 2 (default and new)", len(list))
	}
	run(t, hs.URL, map[string]any{"code": "w = 5", "context_id": c.ID})
	req, _ := http.NewRequest("POST", hs.URL+"/contexts/"+c.ID+"/restart", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("restart: %v %v", resp, err)
	}
	lines = run(t, hs.URL, map[string]any{"code": "'w' in dir()", "context_id": c.ID})
	if got := mainText(lines); got != "False" {
		t.Errorf("w after restart: got %q, want False", got)
	}
	req, _ = http.NewRequest("DELETE", hs.URL+"/contexts/"+c.ID, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	b, _ := json.Marshal(map[string]any{"code": "1", "context_id": c.ID})
	resp, err = http.Post(hs.URL+"/execute", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("execute in a removed context: got %s, want 404", resp.Status)
	}
	resp, _ = http.Post(hs.URL+"/contexts", "application/json", strings.NewReader(`{"language":"cobol"}`))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a context of a language the template lacks: got %s, want 400", resp.Status)
	}
}

// Cells sent to one context at once run one after another, each answered
// with its own output.
func TestConcurrentCellsOfOneContext(t *testing.T) {
	hs, _ := newTestServer(t)
	const n = 8
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			lines, err := execute(t, context.Background(), hs.URL, map[string]any{"code": fmt.Sprintf("v%d = %d\nprint(v%d)\nv%d * 2", i, i, i, i)})
			if err == nil {
				o := ofType(lines, "stdout")
				if got, want := mainText(lines), fmt.Sprint(2*i); got != want || len(o) != 1 || o[0]["text"] != fmt.Sprintf("%d\n", i) {
					err = fmt.Errorf("cell %d: got result %q and stdout %v, want %s and %d", i, got, o, want, i)
				}
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// Removing a context while its cell runs ends that cell's stream with an
// error, and the context stays gone (its kernel is not started again).
func TestRemoveContextWhileRunning(t *testing.T) {
	hs, s := newTestServer(t)
	resp, err := http.Post(hs.URL+"/contexts", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var c codeContext
	json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	k := s.contexts[c.ID].k
	b, _ := json.Marshal(map[string]any{"code": "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)", "context_id": c.ID})
	resp, err = http.Post(hs.URL+"/execute", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var types []string
	for sc.Scan() {
		var l map[string]any
		json.Unmarshal(sc.Bytes(), &l)
		types = append(types, fmt.Sprint(l["type"]))
		if l["type"] == "stdout" {
			req, _ := http.NewRequest("DELETE", hs.URL+"/contexts/"+c.ID, nil)
			if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode/100 != 2 {
				t.Fatalf("delete: %v %v", r, err)
			}
		}
	}
	if n := len(types); n < 2 || types[n-1] != "end_of_execution" || types[n-2] != "error" {
		t.Errorf("got lines %v, want an error, then end_of_execution, last", types)
	}
	k.mu.Lock()
	restarted := k.cmd != nil
	k.mu.Unlock()
	if restarted {
		t.Error("the removed context's kernel was started again")
	}
	var list []codeContext
	r, _ := http.Get(hs.URL + "/contexts")
	json.NewDecoder(r.Body).Decode(&list)
	r.Body.Close()
	for _, l := range list {
		if l.ID == c.ID {
			t.Errorf("the removed context %s is listed", c.ID)
		}
	}
}
