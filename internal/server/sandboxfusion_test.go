package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// verlPayload is the body verl's code reward sends to sandbox_fusion_url
// (verl/utils/reward_score/sandbox_fusion/utils.py: call_sandbox_api), key
// for key in its order, with its headers.
type verlPayload struct {
	CompileTimeout int     `json:"compile_timeout"`
	RunTimeout     int     `json:"run_timeout"`
	Code           string  `json:"code"`
	Stdin          *string `json:"stdin"`
	MemoryLimitMB  int     `json:"memory_limit_MB"`
	Language       string  `json:"language"`
	Files          any     `json:"files"`
	FetchFiles     any     `json:"fetch_files"`
}

type sfClient struct{ url string }

func (c sfClient) post(t *testing.T, route string, body, out any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("POST", c.url+route, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", route, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: HTTP %d, want 200", route, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("POST %s: decode: %v", route, err)
	}
}

// verl sends verl's payload for code in lang to /run_code.
func (c sfClient) verl(t *testing.T, lang, code string, stdin *string, runTimeout, memMB int) sandboxfusion.RunCodeResponse {
	t.Helper()
	var resp sandboxfusion.RunCodeResponse
	c.post(t, "/run_code", verlPayload{CompileTimeout: 30, RunTimeout: runTimeout, Code: code, Stdin: stdin,
		MemoryLimitMB: memMB, Language: lang, Files: map[string]any{}, FetchFiles: []string{}}, &resp)
	return resp
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

// show is a response for a failure message.
func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// sfShared is the package's server with a SandboxFusion service, started
// on first use (its runner template takes minutes to build, once) and
// stopped by TestMain.
var sfShared struct {
	once sync.Once
	e    *env
	url  string
}

// sandboxFusion returns the shared SandboxFusion service once its runner
// template is built and calls run.
func sandboxFusion(t *testing.T) sfClient {
	testenv.NeedRunsc(t)
	sfShared.once.Do(func() {
		dir, err := os.MkdirTemp("", "agentenv-sf-")
		if err != nil {
			t.Fatal(err)
		}
		addr := make(chan string, 1)
		sfShared.e = launchServer(t, dir, "10.131.0.0/20", "sfu", func(c *server.Config) {
			c.SandboxFusion = sandboxfusion.Config{Listen: "127.0.0.1:0", Pool: 2, Ready: func(a string) { addr <- a }}
		})
		sfShared.url = "http://" + <-addr
	})
	if sfShared.url == "" {
		t.Fatal("the SandboxFusion server failed to start earlier")
	}
	c := sfClient{url: sfShared.url}
	// The runner template is built on first start (Debian bookworm with
	// python3, g++ and nodejs: about two minutes); until then calls
	// answer SandboxError saying so.
	deadline := time.Now().Add(15 * time.Minute)
	for {
		resp := c.verl(t, "python", "print('ready')", nil, 10, 1024)
		if resp.Status == sandboxfusion.Success {
			return c
		}
		if !strings.Contains(resp.Message, "being built") && !strings.Contains(resp.Message, "being checked") {
			t.Fatalf("first call: %s, want Success once the runner template is built", show(resp))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runner template was not built within 15 minutes: %s", resp.Message)
		}
		time.Sleep(2 * time.Second)
	}
}

// stopSandboxFusion stops the shared SandboxFusion server, if started,
// killing what its calls left (their kills run after the answer).
func stopSandboxFusion(failed bool) {
	e := sfShared.e
	if e == nil {
		return
	}
	ctx := context.Background()
	if sbs, err := e.client.ListSandboxes(ctx, nil); err == nil {
		for _, sb := range sbs {
			e.client.KillSandbox(ctx, sb.SandboxID)
		}
	}
	e.stop()
	if err := testenv.DropFirewall("sfu"); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	if !failed {
		os.RemoveAll(e.dataDir)
	} else {
		fmt.Fprintf(os.Stderr, "SandboxFusion server log kept in %s/server.log\n", e.dataDir)
	}
}

// TestSandboxFusion sends SandboxFusion calls as verl does to a server's
// --sandboxfusion-listen: each language, a compile error, a timeout,
// files in and out, a memory limit, isolation between calls, 64 calls in
// flight and notebook cells keeping their state.
func TestSandboxFusion(t *testing.T) {
	c := sandboxFusion(t)
	stdin := "3\n4\n"

	t.Run("ping", func(t *testing.T) {
		resp, err := http.Get(c.url + "/v1/ping")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got string
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got != "pong" {
			t.Errorf("GET /v1/ping: got %q (%v), want \"pong\"", got, err)
		}
	})

	langs := []struct{ lang, code string }{
		{"python", "a, b = map(int, open(0).read().split())\nprint(a + b)"},
		{"cpp", "#include <iostream>\nint main() { int a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"},
		{"nodejs", "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);"},
		{"bash", "read a; read b; echo $((a + b))"},
	}
	for _, l := range langs {
		t.Run(l.lang, func(t *testing.T) {
			resp := c.verl(t, l.lang, l.code, &stdin, 10, 1024)
			if resp.Status != sandboxfusion.Success || resp.RunResult == nil || str(resp.RunResult.Stdout) != "7\n" {
				t.Fatalf("%s: got %s, want Success with stdout \"7\\n\"", l.lang, show(resp))
			}
			if rr := resp.RunResult; rr.Status != sandboxfusion.Finished || rr.ReturnCode == nil || *rr.ReturnCode != 0 || rr.ExecutionTime == nil {
				t.Errorf("%s: run_result %s, want Finished, return_code 0 and an execution_time", l.lang, show(rr))
			}
			if compiled := resp.CompileResult != nil; compiled != (l.lang == "cpp") {
				t.Errorf("%s: compile_result %s, want one only for cpp", l.lang, show(resp.CompileResult))
			}
		})
	}

	t.Run("stdin not read", func(t *testing.T) {
		// verl's cases read one line with input() and end; a program may
		// also end without reading any: what it left unread is no error.
		big := strings.Repeat("1 2\n", 1<<18)
		for _, code := range []string{"a, b = map(int, input().split())\nprint(a + b)", "print(3)"} {
			resp := c.verl(t, "python", code, &big, 10, 1024)
			if resp.Status != sandboxfusion.Success || str(resp.RunResult.Stdout) != "3\n" {
				t.Errorf("%q with 1 MiB of stdin: got %s, want Success printing 3", code, show(resp))
			}
		}
	})

	t.Run("compile error", func(t *testing.T) {
		resp := c.verl(t, "cpp", "int main() { return undeclared; }", nil, 10, 1024)
		cr := resp.CompileResult
		if resp.Status != sandboxfusion.Failed || cr == nil || cr.Status != sandboxfusion.Finished || cr.ReturnCode == nil || *cr.ReturnCode == 0 {
			t.Fatalf("got %s, want Failed with a compile_result Finished with a non-zero return_code", show(resp))
		}
		if !strings.Contains(str(cr.Stderr), "undeclared") || resp.RunResult != nil {
			t.Errorf("got compile stderr %q and run_result %s, want g++'s error naming 'undeclared' and no run", str(cr.Stderr), show(resp.RunResult))
		}
	})

	t.Run("unknown language", func(t *testing.T) {
		resp := c.verl(t, "cobol", "DISPLAY 'HI'.", nil, 10, 1024)
		if resp.Status != sandboxfusion.SandboxError || !strings.Contains(resp.Message, `"cobol"`) {
			t.Errorf("got %s, want SandboxError naming the language", show(resp))
		}
	})

	t.Run("timeout", func(t *testing.T) {
		resp := c.verl(t, "python", "import time\nprint('started', flush=True)\ntime.sleep(60)", nil, 1, 1024)
		rr := resp.RunResult
		if resp.Status != sandboxfusion.Failed || rr == nil || rr.Status != sandboxfusion.TimeLimitExceeded {
			t.Fatalf("got %s, want Failed with run_result TimeLimitExceeded", show(resp))
		}
		if str(rr.Stdout) != "started\n" {
			t.Errorf("stdout before the time limit: got %q, want %q", str(rr.Stdout), "started\n")
		}
	})

	t.Run("files", func(t *testing.T) {
		in := base64.StdEncoding.EncodeToString([]byte("hello"))
		var resp sandboxfusion.RunCodeResponse
		c.post(t, "/run_code", map[string]any{
			"language": "python", "code": "s = open('data/in.txt').read()\nopen('out.txt', 'w').write(s.upper())\nprint(s)",
			"files": map[string]any{"data/in.txt": in, "skipped.txt": nil}, "fetch_files": []string{"out.txt", "missing.txt"},
		}, &resp)
		if resp.Status != sandboxfusion.Success || str(resp.RunResult.Stdout) != "hello\n" {
			t.Fatalf("got %s, want Success printing the file sent", show(resp))
		}
		got, err := base64.StdEncoding.DecodeString(resp.Files["out.txt"])
		if err != nil || string(got) != "HELLO" || len(resp.Files) != 1 {
			t.Errorf("fetched files: got %v, want out.txt = HELLO (in base64) alone", resp.Files)
		}
	})

	t.Run("memory limit", func(t *testing.T) {
		grab := "x = bytearray(400 << 20)\nprint(len(x) >> 20)"
		resp := c.verl(t, "python", grab, nil, 10, 200)
		if resp.Status != sandboxfusion.Failed || !strings.Contains(str(resp.RunResult.Stderr), "MemoryError") {
			t.Errorf("400 MiB under memory_limit_MB 200: got %s, want Failed with a MemoryError", show(resp))
		}
		// The same code within its limit: it is the limit that stopped it.
		resp = c.verl(t, "python", grab, nil, 10, 1024)
		if resp.Status != sandboxfusion.Success || str(resp.RunResult.Stdout) != "400\n" {
			t.Errorf("400 MiB under memory_limit_MB 1024: got %s, want Success", show(resp))
		}
	})

	t.Run("isolation", func(t *testing.T) {
		// The first call leaves files, a process in the background and a
		// listening socket; the next call must see none of them.
		leave := `echo left > /tmp/left; echo left > "$HOME/left"; echo left > left
setsid nohup sleep 600 >/dev/null 2>&1 &
setsid nohup python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 7777)); s.listen(); time.sleep(600)" >/dev/null 2>&1 &
sleep 1; echo done`
		if resp := c.verl(t, "bash", leave, nil, 10, 1024); resp.Status != sandboxfusion.Success || str(resp.RunResult.Stdout) != "done\n" {
			t.Fatalf("first call: got %s, want Success", show(resp))
		}
		look := `import os, socket
found = [p for p in ("/tmp/left", os.path.expanduser("~/left"), "left") if os.path.exists(p)]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmd = open("/proc/%s/cmdline" % pid, "rb").read()
        except OSError:
            continue
        if b"sleep\x00600" in cmd or b"7777" in cmd:
            found.append("process " + pid)
try:
    socket.create_connection(("127.0.0.1", 7777), timeout=2).close()
    found.append("port 7777 open")
except OSError:
    pass
print(found)`
		resp := c.verl(t, "python", look, nil, 10, 1024)
		if resp.Status != sandboxfusion.Success || str(resp.RunResult.Stdout) != "[]\n" {
			t.Errorf("second call found what the first left: got %s, want []", show(resp))
		}
	})

	t.Run("64 in flight", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan string, 64)
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var resp sandboxfusion.RunCodeResponse
				b, _ := json.Marshal(verlPayload{CompileTimeout: 10, RunTimeout: 10, Code: fmt.Sprintf("print(%d * %d)", i, i),
					MemoryLimitMB: 1024, Language: "python", Files: map[string]any{}, FetchFiles: []string{}})
				r, err := http.Post(c.url+"/run_code", "application/json", bytes.NewReader(b))
				if err != nil {
					errs <- err.Error()
					return
				}
				defer r.Body.Close()
				if err := json.NewDecoder(r.Body).Decode(&resp); err != nil {
					errs <- err.Error()
					return
				}
				if want := fmt.Sprintf("%d\n", i*i); resp.Status != sandboxfusion.Success || resp.RunResult == nil || str(resp.RunResult.Stdout) != want {
					errs <- fmt.Sprintf("call %d: got %s, want Success printing %q", i, show(resp), want)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})

	t.Run("jupyter", func(t *testing.T) {
		var resp sandboxfusion.RunJupyterResponse
		c.post(t, "/run_jupyter", map[string]any{
			"cells": []string{"a = 41", "a + 1", "print(a)", "import sys; sys.stderr.write('warn\\n')", "raise RuntimeError('boom')", "a * 2"},
		}, &resp)
		if resp.Status != sandboxfusion.Success || len(resp.Cells) != 6 {
			t.Fatalf("got %s, want Success with 6 cells", show(resp))
		}
		cells := resp.Cells
		if len(cells[1].Display) != 1 || cells[1].Display[0]["text/plain"] != "42" {
			t.Errorf("cell 'a + 1' after 'a = 41': display %v, want text/plain 42", cells[1].Display)
		}
		if cells[2].Stdout != "41\n" || cells[3].Stderr != "warn\n" {
			t.Errorf("print(a) stdout %q, stderr cell %q: want \"41\\n\" and \"warn\\n\"", cells[2].Stdout, cells[3].Stderr)
		}
		if len(cells[4].Error) != 1 || cells[4].Error[0]["ename"] != "RuntimeError" || cells[4].Error[0]["evalue"] != "boom" {
			t.Errorf("raising cell: error %v, want RuntimeError boom", cells[4].Error)
		}
		if len(cells[5].Display) != 1 || cells[5].Display[0]["text/plain"] != "82" {
			t.Errorf("cell after the error: display %v, want 82 (state kept)", cells[5].Display)
		}
	})

	// As SandboxFusion's Jupyter runner: each display is the object's data
	// bundle, rich reprs adding their MIME types (binary ones in base64),
	// display() one per object. (Figures as PNGs need matplotlib, which the
	// default runner leaves out: internal/sandboxfusion's TestJupyterDriverDisplays.)
	t.Run("jupyter displays", func(t *testing.T) {
		var resp sandboxfusion.RunJupyterResponse
		c.post(t, "/run_jupyter", map[string]any{
			"cells": []string{
				"class T:\n    def _repr_html_(self):\n        return '<table></table>'\n    def _repr_png_(self):\n        return b'\\x89PNG fake'\nT()",
				"display('a', T())",
				"x = 1\nx;"},
		}, &resp)
		if resp.Status != sandboxfusion.Success || len(resp.Cells) != 3 {
			t.Fatalf("got %s, want Success with 3 cells", show(resp))
		}
		d := resp.Cells[0].Display
		if len(d) != 1 || d[0]["text/html"] != "<table></table>" || d[0]["text/plain"] == nil {
			t.Fatalf("an object with _repr_html_ and _repr_png_: displays %v (errors %v), want text/html and text/plain", d, resp.Cells[0].Error)
		}
		if png, _ := base64.StdEncoding.DecodeString(fmt.Sprint(d[0]["image/png"])); string(png) != "\x89PNG fake" {
			t.Errorf("_repr_png_'s bytes: got image/png %v, want them in base64", d[0]["image/png"])
		}
		if d := resp.Cells[1].Display; len(d) != 2 || d[0]["text/plain"] != "'a'" || d[1]["text/html"] != "<table></table>" {
			t.Errorf("display('a', T()): displays %v, want two bundles", d)
		}
		if d := resp.Cells[2].Display; len(d) != 0 {
			t.Errorf("a cell ending in ';': displays %v, want none", d)
		}
	})
}
