package lifecycletest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serve is the test binary run as an agentenv server on the fake runtime
// (serveMain), in its own process so that it can crash.
type serve struct {
	t          *testing.T
	cmd        *exec.Cmd
	api, proxy string
	dir        string
}

func startServe(t *testing.T, dir, cidr string) *serve {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+dir, "LIFECYCLETEST_CIDR="+cidr, "AGENTENV_TEST_ENVD="+envdBin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &serve{t: t, cmd: cmd, dir: dir}
	t.Cleanup(func() { s.crash() })
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
		io.Copy(io.Discard, out)
	}()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "READY" {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Fatalf("server did not start: %q\nstderr: %s\nlog:\n%s", line, stderr.String(), log)
		}
		s.api, s.proxy = "http://"+f[1], "http://"+f[2]
	case <-time.After(time.Minute):
		t.Fatalf("server not ready within a minute: %s", stderr.String())
	}
	return s
}

// crash kills the server with SIGKILL: no shutdown of any kind.
func (s *serve) crash() {
	if s.cmd.ProcessState == nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// do sends an API request and decodes a JSON answer into out (if any).
func (s *serve) do(method, path, body string, out any) int {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.api+path, strings.NewReader(body))
	req.Header.Set("X-API-Key", "e2b_lifecycletest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			s.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	if m, ok := out.(*map[string]any); ok && resp.StatusCode/100 != 2 {
		*m = map[string]any{"message": string(b)}
	}
	return resp.StatusCode
}

func (s *serve) create() string {
	s.t.Helper()
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if code := s.do("POST", "/sandboxes", `{"templateID":"busybox","timeout":600}`, &sb); code != http.StatusCreated {
		s.t.Fatalf("create: %d", code)
	}
	return sb.SandboxID
}

func (s *serve) state(id string) (string, string) {
	s.t.Helper()
	var sb map[string]any
	if code := s.do("GET", "/sandboxes/"+id, "", &sb); code/100 != 2 {
		msg, _ := sb["message"].(string)
		return "", msg
	}
	st, _ := sb["state"].(string)
	return st, ""
}

// The server dies with SIGKILL and starts again on the same data dir:
// sandboxes that survived are adopted as they were (running, paused),
// one that died meanwhile is cleaned up and reported lost, and killing
// the survivors leaves no process and no runtime state.
func TestUnprivilegedRecoverAfterCrash(t *testing.T) {
	dir := t.TempDir()
	cidr := newCIDR()
	t.Cleanup(func() {
		for _, pid := range envdProcs(dir) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	s := startServe(t, dir, cidr)
	running, paused, dies := s.create(), s.create(), s.create()
	if code := s.do("POST", "/sandboxes/"+paused+"/pause", "", nil); code/100 != 2 {
		t.Fatalf("pause: %d", code)
	}
	s.crash()

	// While the server is down, one sandbox's processes die.
	x := &host{t: t, dir: dir}
	syscall.Kill(-x.pid(dies), syscall.SIGKILL)

	s = startServe(t, dir, cidr)
	if st, msg := s.state(running); st != "running" {
		t.Errorf("running sandbox after the crash: %q %s, want running", st, msg)
	}
	if code, _ := viaProxy(t, s.proxy, running, 5*time.Second); code/100 != 2 {
		t.Errorf("adopted sandbox through the new proxy: %d, want 2xx", code)
	}
	if st, msg := s.state(paused); st != "paused" {
		t.Errorf("paused sandbox after the crash: %q %s, want paused", st, msg)
	}
	if st, msg := s.state(dies); st != "" || !strings.Contains(msg, "lost") {
		t.Errorf("sandbox that died while the server was down: %q %q, want not found, lost", st, msg)
	}
	if code := s.do("POST", "/sandboxes/"+paused+"/resume", `{"timeout":60}`, nil); code/100 != 2 {
		t.Errorf("resume an adopted paused sandbox: %d", code)
	}
	if code, _ := viaProxy(t, s.proxy, paused, 5*time.Second); code/100 != 2 {
		t.Errorf("resumed adopted sandbox through the proxy: %d, want 2xx", code)
	}
	for _, id := range []string{running, paused} {
		if code := s.do("DELETE", "/sandboxes/"+id, "", nil); code/100 != 2 {
			t.Errorf("kill %s: %d", id, code)
		}
	}
	eventually(t, "no runtime state left", func() bool {
		ents, _ := os.ReadDir(filepath.Join(dir, "fake"))
		return len(ents) == 0
	})
	if pids := envdProcs(dir); len(pids) > 0 {
		t.Errorf("sandbox processes left after every sandbox was killed: %v", pids)
	}
}
