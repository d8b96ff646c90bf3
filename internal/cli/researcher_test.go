package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/testenv"
)

// The researcher's path through the CLI: the agentenv binary, built from
// this tree, against `agentenv serve` run from the same binary with its
// own data dir, ports and network range.

const testKey = "cli-test-key"

// TestResearcherPath runs the CLI's commands end to end, one subtest each.
func TestResearcherPath(t *testing.T) {
	testenv.NeedRunsc(t)
	bin := testenv.BuildAgentenv(t, t.TempDir())
	t.Run("typos", func(t *testing.T) { testTypos(t, &server{bin: bin}) })
	s := startServer(t, bin)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *server)
	}{
		{"exec", testExec},
		{"interrupt", testExecInterrupt},
		{"cp", testCopy},
		{"not-running", testNotRunning},
		{"snapshot-name", testSnapshotName},
		{"template-delete-warm", testTemplateDeleteWarm},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, s) })
	}
}

// server is `agentenv serve` with ready templates and one warm container
// per template; without an api address, the CLI aims at nothing.
type server struct {
	bin, dir, api, proxy string
	cmd                  *exec.Cmd
	c                    *client.Client
}

// startServer starts the server and stops it when the test ends (its log
// is kept if the test failed).
func startServer(t *testing.T, bin string) *server {
	dir, err := os.MkdirTemp("", "agentenv-cli-test-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{bin: bin, dir: dir}
	log, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	s.cmd = exec.Command(bin, "serve", "--data-dir", dir, "--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--network-cidr", "10.124.0.0/20", "--network-tag", "cli", "--ready-templates", "--warm-pool", "1", "--slot-pool", "2")
	s.cmd.Env = append(os.Environ(), "AGENTENV_API_KEY="+testKey)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// If the test binary dies (timeout), the server goes with it.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.stop()
		if err := testenv.DropFirewall("cli"); err != nil {
			t.Log(err)
		}
		if t.Failed() {
			t.Logf("agentenv serve log kept in %s/serve.log", dir)
			return
		}
		os.RemoveAll(dir)
	})
	s.api, s.proxy = testenv.ServeAddrs(t, log.Name(), 0, 3*time.Minute)
	s.c = client.New("http://"+s.api, "http://"+s.proxy, testKey)
	// Up once busybox is built and ready.
	waitFor(t, 3*time.Minute, "busybox template ready on the server", func() bool {
		ts, err := s.c.ListTemplates(context.Background())
		if err != nil {
			return false
		}
		for _, tpl := range ts {
			if tpl.TemplateID == "busybox" && tpl.Ready {
				return true
			}
		}
		return false
	})
	return s
}

func (s *server) stop() {
	ctx := context.Background()
	if sbs, err := s.c.ListSandboxes(ctx, nil); err == nil {
		for _, sb := range sbs {
			s.c.KillSandbox(ctx, sb.SandboxID)
		}
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
}

// result is one run of the CLI.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
}

// command is the CLI aimed at the server.
func (s *server) command(t *testing.T, args ...string) *exec.Cmd {
	api, proxy := "http://127.0.0.1:1", "http://127.0.0.1:1"
	if s.api != "" {
		api, proxy = "http://"+s.api, "http://"+s.proxy
	}
	cmd := exec.Command(s.bin, append([]string{"--server", api, "--proxy", proxy}, args...)...)
	cmd.Env = append(os.Environ(), "AGENTENV_API_KEY="+testKey)
	return cmd
}

// run runs the CLI with stdin and returns what it printed and its code.
func (s *server) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	cmd := s.command(t, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("agentenv %q: %v", args, err)
	}
	return r
}

// ok runs the CLI and fails the test unless it exits 0.
func (s *server) ok(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := s.run(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("agentenv %q: %v", args, r)
	}
	return r.stdout
}

// sandbox creates a sandbox with the CLI and kills it when the test ends.
func (s *server) sandbox(t *testing.T, from string) string {
	t.Helper()
	id := strings.TrimSpace(s.ok(t, "", "sandbox", "create", from))
	t.Cleanup(func() { s.c.KillSandbox(context.Background(), id) })
	return id
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: no %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testTypos: a mistyped command exits 2 with a suggestion and prints
// nothing on stdout; a command's flag after the sandbox ID hints at `--`.
// No server is needed: these fail before any request.
func testTypos(t *testing.T, none *server) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox", "crate", "base"}, "did you mean create?"},
		{[]string{"sandbx", "list"}, "did you mean sandbox?"},
		{[]string{"template", "delet", "x"}, "did you mean delete?"},
		{[]string{"sandbox", "exec", "sb-1", "ls", "-la"}, "agentenv sandbox exec sb-1 -- ls -la"},
		{[]string{"sandbox", "list", "--jsn"}, "unknown flag: --jsn"},
	} {
		r := none.run(t, "", tc.args...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("agentenv %q: %v; want exit 2, nothing on stdout, %q on stderr", tc.args, r, tc.want)
		}
	}
}

// testExec: stdin is streamed to the command (then end-of-file), the
// flags --cwd, --env, --user and --timeout work, and an empty list in
// JSON is [].
func testExec(t *testing.T, s *server) {
	id := s.sandbox(t, "busybox")
	if got := s.ok(t, "print(1)\nline two\n", "sandbox", "exec", id, "cat"); got != "print(1)\nline two\n" {
		t.Errorf("piped stdin: got %q, want the input back", got)
	}
	big := strings.Repeat("0123456789abcdef", 1<<14) // 256 KiB: many input messages
	if got := s.ok(t, big, "sandbox", "exec", id, "--", "wc", "-c"); strings.TrimSpace(got) != fmt.Sprint(len(big)) {
		t.Errorf("wc -c of %d piped bytes: got %q", len(big), got)
	}
	if got := s.ok(t, "", "sandbox", "exec", "--cwd", "/tmp", "-e", "GREETING=hi there", "-u", "root", id, "echo $PWD $GREETING $(id -u)"); got != "/tmp hi there 0\n" {
		t.Errorf("--cwd --env --user: got %q, want %q", got, "/tmp hi there 0\n")
	}
	start := time.Now()
	r := s.run(t, "", "sandbox", "exec", "--timeout", "1s", id, "sleep 30")
	if r.code != 124 || !strings.Contains(r.stderr, "timeout") || time.Since(start) > 20*time.Second {
		t.Errorf("--timeout 1s on sleep 30: %v after %s; want exit 124 soon, saying so", r, time.Since(start))
	}
	if got := s.ok(t, "", "--json", "sandbox", "list", "-m", "nothing=matches"); strings.TrimSpace(got) != "[]" {
		t.Errorf("sandbox list --json with no match: got %q, want []", got)
	}
	if got := s.ok(t, "", "--json", "snapshot", "list", "--sandbox", id); strings.TrimSpace(got) != "[]" {
		t.Errorf("snapshot list --json with none: got %q, want []", got)
	}
}

// testExecInterrupt: Ctrl-C on exec kills the command in the sandbox
// (not only the CLI) and exits 130.
func testExecInterrupt(t *testing.T, s *server) {
	id := s.sandbox(t, "busybox")
	sleeping := func() bool {
		return strings.Contains(s.ok(t, "", "sandbox", "exec", id, "ps"), "sleep 4242")
	}
	cmd := s.command(t, "sandbox", "exec", id, "sleep 4242")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, 30*time.Second, "sleep 4242 running in the sandbox", sleeping)
	cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("after SIGINT: %v (output %q); want exit status 130", err, out.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("the CLI did not exit within 20s of SIGINT")
	}
	waitFor(t, 10*time.Second, "end of sleep 4242 in the sandbox after Ctrl-C", func() bool { return !sleeping() })
}

// testCopy: `sandbox cp` both ways, a file and a directory tree.
func testCopy(t *testing.T, s *server) {
	id := s.sandbox(t, "busybox")
	local := t.TempDir()
	tree := filepath.Join(local, "data")
	files := map[string]string{"a.txt": "alpha\n", "sub/b.bin": strings.Repeat("\x00\xffbinary", 50000), "sub/deeper/c": ""}
	for name, content := range files {
		p := filepath.Join(tree, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink("a.txt", filepath.Join(tree, "link"))

	// In: a file to a new name, a directory into an existing directory.
	s.ok(t, "", "sandbox", "cp", filepath.Join(tree, "a.txt"), id+":/tmp/one.txt")
	if got := s.ok(t, "", "sandbox", "exec", id, "cat /tmp/one.txt"); got != "alpha\n" {
		t.Errorf("file copied in: got %q", got)
	}
	r := s.run(t, "", "sandbox", "cp", tree, id+":/tmp")
	if r.code != 0 || !strings.Contains(r.stderr, "skipped") {
		t.Fatalf("directory copied in: %v; want success with a warning about the symlink", r)
	}
	got := s.ok(t, "", "sandbox", "exec", id, "cd /tmp/data && find . -type f | sort && md5sum sub/b.bin && ls -a sub/deeper")
	want := fmt.Sprintf("./a.txt\n./sub/b.bin\n./sub/deeper/c\n%s  sub/b.bin\n.\n..\nc\n", md5(t, files["sub/b.bin"]))
	if got != want {
		t.Errorf("directory copied in: got\n%s\nwant\n%s", got, want)
	}

	// Out: a file into a directory, a directory to a new name; modes kept.
	s.ok(t, "", "sandbox", "exec", id, "chmod 751 /tmp/data/sub/deeper/c")
	out := t.TempDir()
	s.ok(t, "", "sandbox", "cp", id+":/tmp/one.txt", out)
	if b, err := os.ReadFile(filepath.Join(out, "one.txt")); err != nil || string(b) != "alpha\n" {
		t.Errorf("file copied out: %q, %v", b, err)
	}
	s.ok(t, "", "sandbox", "cp", id+":/tmp/data", filepath.Join(out, "copy"))
	for name, content := range files {
		b, err := os.ReadFile(filepath.Join(out, "copy", name))
		if err != nil || string(b) != content {
			t.Errorf("%s copied out: %d bytes, %v; want %d bytes", name, len(b), err, len(content))
		}
	}
	if st, err := os.Stat(filepath.Join(out, "copy", "sub", "deeper", "c")); err != nil || st.Mode().Perm() != 0o751 {
		t.Errorf("mode of a file copied out: %v, %v; want 0751", st.Mode(), err)
	}
	if r := s.run(t, "", "sandbox", "cp", id+":/tmp/nothing-here", out); r.code == 0 || !strings.Contains(r.stderr, "nothing-here") {
		t.Errorf("copying out what does not exist: %v; want an error naming it", r)
	}
}

func md5(t *testing.T, s string) string {
	t.Helper()
	c := exec.Command("md5sum")
	c.Stdin = strings.NewReader(s)
	b, err := c.Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))[0]
}

// testNotRunning: exec on a paused sandbox says it is paused and how
// to resume it; on a killed or timed-out one, how and when it ended.
func testNotRunning(t *testing.T, s *server) {
	id := s.sandbox(t, "busybox")
	s.ok(t, "", "sandbox", "pause", id)
	r := s.run(t, "", "sandbox", "exec", id, "true")
	if want := fmt.Sprintf("sandbox %s is paused: resume it with `agentenv sandbox resume %s`", id, id); r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("exec on a paused sandbox: %v; want %q", r, want)
	}
	s.ok(t, "", "sandbox", "resume", id)
	s.ok(t, "", "sandbox", "exec", id, "true")
	s.ok(t, "", "sandbox", "kill", id)
	if r := s.run(t, "", "sandbox", "exec", id, "true"); r.code != 3 || !strings.Contains(r.stderr, "it was killed at") || !strings.Contains(r.stderr, "\ncause: killed (") {
		t.Errorf("exec on a killed sandbox: %v; want exit 3 saying it was killed, cause killed", r)
	}
	short := strings.TrimSpace(s.ok(t, "", "sandbox", "create", "--timeout", "1", "busybox"))
	waitFor(t, 30*time.Second, "end of the sandbox at its timeout", func() bool {
		_, err := s.c.GetSandbox(context.Background(), short)
		return err != nil
	})
	if r := s.run(t, "", "sandbox", "exec", short, "true"); r.code != 3 || !strings.Contains(r.stderr, "it timed out at") || !strings.Contains(r.stderr, "\ncause: sandbox_timeout (") {
		t.Errorf("exec on a timed-out sandbox: %v; want exit 3 saying it timed out, cause sandbox_timeout", r)
	}
}

// testSnapshotName: `sandbox create NAME` restores the snapshot of that
// name, and the new sandbox shows its lineage.
func testSnapshotName(t *testing.T, s *server) {
	parent := s.sandbox(t, "busybox")
	s.ok(t, "", "sandbox", "exec", parent, "echo kept > /tmp/state")
	name := fmt.Sprintf("ready-%d", time.Now().UnixNano())
	snap := strings.TrimSpace(s.ok(t, "", "sandbox", "snapshot", parent, "--name", name))
	t.Cleanup(func() { s.c.DeleteSnapshot(context.Background(), snap) })
	child := s.sandbox(t, name)
	if got := s.ok(t, "", "sandbox", "exec", child, "cat /tmp/state"); got != "kept\n" {
		t.Errorf("sandbox restored by snapshot name: /tmp/state is %q, want the parent's", got)
	}
	var sb client.Sandbox
	if err := json.Unmarshal([]byte(s.ok(t, "", "--json", "sandbox", "get", child)), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.SnapshotID != snap || sb.ParentSandboxID != parent {
		t.Errorf("lineage: snapshot %q, parent %q; want %q, %q", sb.SnapshotID, sb.ParentSandboxID, snap, parent)
	}
	if got := s.ok(t, "", "sandbox", "list"); !strings.Contains(got, snap) || !strings.Contains(got, parent) {
		t.Errorf("sandbox list does not show the lineage:\n%s", got)
	}
	if r := s.run(t, "", "sandbox", "create", "no-such-name"); r.code != 3 || !strings.Contains(r.stderr, "snapshot name") {
		t.Errorf("create from an unknown name: %v; want exit 3 naming templates and snapshots", r)
	}
}

// testTemplateDeleteWarm: a template's warm containers (which the
// user cannot see) neither block its delete nor count as in use, and a
// ready template lists as starting from a snapshot.
func testTemplateDeleteWarm(t *testing.T, s *server) {
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755)
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox to build a template from: %v", err)
	}
	os.WriteFile(filepath.Join(rootfs, "bin", "busybox"), b, 0o755)
	os.Symlink("busybox", filepath.Join(rootfs, "bin", "sh"))
	warm := func() int {
		m, _ := filepath.Glob(filepath.Join(s.dir, "sandboxes", "*", "warm"))
		return len(m)
	}
	const name = "tiny-warm"
	s.ok(t, "", "template", "build", name, "--rootfs", rootfs)
	// --warm-pool 1: one for busybox, one for the new template.
	waitFor(t, 60*time.Second, "warm container of the new template", func() bool { return warm() == 2 })
	var ts []client.Template
	if err := json.Unmarshal([]byte(s.ok(t, "", "--json", "template", "list")), &ts); err != nil {
		t.Fatal(err)
	}
	for _, tpl := range ts {
		if tpl.TemplateID == name && (tpl.InUse != 0 || !tpl.Ready) {
			t.Errorf("template %s: in use by %d, ready %v; want 0 (warm containers are not sandboxes) and ready", name, tpl.InUse, tpl.Ready)
		}
	}
	if got := s.ok(t, "", "template", "list"); !strings.Contains(got, "START") || !strings.Contains(got, "snapshot") {
		t.Errorf("template list does not say how sandboxes start:\n%s", got)
	}
	if r := s.run(t, "", "template", "delete", name); r.code != 0 {
		t.Fatalf("template delete with a warm container: %v; want it deleted", r)
	}
	waitFor(t, 30*time.Second, "removal of the deleted template's warm container", func() bool { return warm() == 1 })
}
