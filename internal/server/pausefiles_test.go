package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/agentenv/agentenv/client"
	procpb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// A pause without memory must use no tool of the sandbox and must not let
// the sandbox exhaust the host (no host tool reads its files): envd does the work,
// the host keeps a capped stream. The lifecycle tests (lifecycle_test.go)
// run on busybox and on gnuTemplate.

var (
	gnuOnce sync.Once
	gnuErr  error
)

// gnuTemplate uploads (once per server) a template of the host's GNU tools
// (testenv.GNURootfs) and returns its name.
func gnuTemplate(t *testing.T, e *env) string {
	t.Helper()
	const name = "gnu"
	gnuOnce.Do(func() {
		src := t.TempDir()
		testenv.GNURootfs(t, src)
		ctx := context.Background()
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(template.WriteTar(ctx, pw, src)) }()
		_, gnuErr = e.client.UploadTemplate(ctx, name, pr, func(client.BuildProgress) {})
	})
	if gnuErr != nil {
		t.Fatalf("upload the GNU template: %v", gnuErr)
	}
	return name
}

// runAs runs cmd with args in sb as root through envd, whatever /bin/sh
// has become, and returns its exit code and output (both streams).
func runAs(t *testing.T, e *env, sb client.Sandbox, cmd string, args ...string) (int, string) {
	t.Helper()
	a := e.envdAs(t, sb, "root")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := a.proc.Start(ctx, connect.NewRequest(&procpb.StartRequest{
		Process: &procpb.ProcessConfig{Cmd: cmd, Args: args}, Stdin: proto.Bool(false)}))
	if err != nil {
		t.Fatalf("start %s: %v", cmd, err)
	}
	defer s.Close()
	var out strings.Builder
	code := -1
	for s.Receive() {
		ev := s.Msg().GetEvent()
		out.Write(ev.GetData().GetStdout())
		out.Write(ev.GetData().GetStderr())
		if end := ev.GetEnd(); end != nil {
			code = int(end.GetExitCode())
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	return code, out.String()
}

// rssKiB reads a line (VmRSS, VmHWM) of this process's status: the server
// runs in it.
func rssKiB(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// hostile replaces the sandbox's tools (busybox applets) with scripts: a
// /bin/sh that prints 200 MB and fails, and tar, find, cpio, xargs, rm and
// head that lie or fail.
const hostile = `set -e
cd /bin
rm -f sh tar find cpio xargs rm head
printf '#!/bin/busybox sh\n/bin/busybox head -c 200000000 /dev/zero | /bin/busybox tr "\\\\0" x\n/bin/busybox head -c 1000000 /dev/zero >&2\nexit 1\n' > sh
printf '#!/bin/busybox sh\necho "tar: all saved"\nexit 0\n' > tar
printf '#!/bin/busybox sh\necho ./etc/passwd\nexit 0\n' > find
for t in cpio xargs rm head; do printf '#!/bin/busybox sh\nexit 3\n' > $t; done
/bin/busybox chmod 755 sh tar find cpio xargs rm head
echo kept > /home/user/kept`

// TestPauseWithoutMemoryHostileSandbox: a sandbox whose /bin/sh prints
// 200 MB and whose tar, find... lie or fail pauses without memory and
// resumes with its files (hostile tools included), and the server's memory
// stays put (it went from 50 MB to 1.2 GB when the pause ran /bin/sh).
func TestPauseWithoutMemoryHostileSandbox(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(120))})
	if code, out := runAs(t, e, sb, "/bin/busybox", "sh", "-c", hostile); code != 0 {
		t.Fatalf("make the sandbox hostile: exit %d: %s", code, out)
	}
	if _, out := runAs(t, e, sb, "/bin/busybox", "sh", "-c", "/bin/sh 2>/dev/null | /bin/busybox wc -c"); strings.TrimSpace(out) != "200000000" {
		t.Fatalf("hostile /bin/sh printed %q bytes, want 200000000", out)
	}
	// The peak from here on: the pause and the resume.
	rss := rssKiB(t, "VmRSS")
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("reset the peak RSS: %v", err)
	}
	if status, out := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`)); status != http.StatusNoContent {
		t.Fatalf("pause without memory of a hostile sandbox: %d %v", status, out)
	}
	if got := e.connect(t, sb.SandboxID, `{"timeout": 60}`); got != http.StatusCreated {
		t.Fatalf("connect: %d, want 201", got)
	}
	growth := rssKiB(t, "VmHWM") - rss
	t.Logf("server RSS %d MiB before; peak %+d MiB during pause and resume", rss>>10, growth>>10)
	if growth > 100<<10 {
		t.Errorf("the server's RSS grew by %d MiB pausing and resuming a hostile sandbox, want under 100 MiB", growth>>10)
	}
	code, out := runAs(t, e, sb, "/bin/busybox", "sh", "-c", "cat /home/user/kept /bin/tar; test -e /bin/rm && echo rm-kept")
	if code != 0 || out != "kept\n#!/bin/busybox sh\necho \"tar: all saved\"\nexit 0\nrm-kept\n" {
		t.Errorf("after resume: exit %d %q, want the files and the hostile tools kept", code, out)
	}
}

// TestPauseWithoutMemoryKeepsLinksAsLinks: links to a huge sparse file, to
// /proc/self/mem, /proc/kcore and /dev/zero are saved as links: the host
// stores a few KiB, and the resumed sandbox has the same links.
func TestPauseWithoutMemoryKeepsLinksAsLinks(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{TemplateID: diskTemplate(t, e, 64), Timeout: new(int64(120))})
	const links = `set -e; cd /home/user
truncate -s 2G /dev/shm/sparse
ln -s /dev/shm/sparse big; ln -s /proc/self/mem mem; ln -s /proc/kcore kcore; ln -s /dev/zero zero
echo small > small`
	e.envdAs(t, sb, "root").sh(links)
	if status, out := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`)); status != http.StatusNoContent {
		t.Fatalf("pause without memory: %d %v", status, out)
	}
	stored := storedFiles(t, e, sb.SandboxID)
	t.Logf("the host stores %d KiB for the paused sandbox", stored>>10)
	if stored > 1<<20 {
		t.Errorf("the host stores %d KiB for a sandbox of links, want a few KiB", stored>>10)
	}
	e.connect(t, sb.SandboxID, `{"timeout": 60}`)
	got := e.envdAs(t, sb, "root").sh(`cd /home/user; for l in big mem kcore zero; do readlink $l; done; cat small`)
	if want := "/dev/shm/sparse\n/proc/self/mem\n/proc/kcore\n/dev/zero\nsmall\n"; got != want {
		t.Errorf("after resume: %q, want %q", got, want)
	}
}

// storedFiles returns the bytes the host keeps for a sandbox paused
// without memory.
func storedFiles(t *testing.T, e *env, id string) int64 {
	t.Helper()
	var total int64
	filepath.Walk(e.dataDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() && strings.Contains(p, id) && filepath.Base(filepath.Dir(p)) == "files" {
			total += info.Size()
		}
		return nil
	})
	if total == 0 {
		t.Fatalf("no files kept on the host for sandbox %s", id)
	}
	return total
}

// TestPauseWithoutMemoryOverCap: a sandbox whose changed files exceed what
// its write layer holds (a sparse 2 GiB file on a 64 MiB disk) gets a clear
// error, keeps running with its files, and the host keeps nothing.
func TestPauseWithoutMemoryOverCap(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{TemplateID: diskTemplate(t, e, 64), Timeout: new(int64(120))})
	e.envdAs(t, sb, "root").sh(`truncate -s 2G /home/user/huge && echo still > /home/user/still`)
	start := time.Now()
	status, out := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", testKey, strings.NewReader(`{"memory": false}`))
	msg := fmt.Sprint(out["message"])
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "pause with its memory") || !strings.Contains(msg, "keeps running") {
		t.Errorf("pause without memory over the cap: %d %v, want 413 saying the sandbox keeps running and what to do", status, out)
	}
	t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), msg)
	if got, err := e.client.GetSandbox(context.Background(), sb.SandboxID); err != nil || got.State != "running" {
		t.Errorf("after the refused pause: %+v %v, want it running", got, err)
	}
	if got := e.envdAs(t, sb, "root").sh(`cat /home/user/still; stat -c %s /home/user/huge`); got != "still\n2147483648\n" {
		t.Errorf("after the refused pause: %q, want its files as they were", got)
	}
	matches, _ := filepath.Glob(filepath.Join(e.dataDir, "*", sb.SandboxID, "files"))
	if len(matches) != 0 {
		t.Errorf("the host kept %v after refusing the pause", matches)
	}
}
