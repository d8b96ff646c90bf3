package server_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/template"
)

// TestTemplateBuildCannotReachHost checks through the API that a template
// build cannot reach the host: a client cannot pick the Debian mirror (an
// unsigned mirror would run a package script as host root), cannot name a
// host path (host files would be copied in), and an uploaded rootfs with
// symlinks out builds without touching the host.
func TestTemplateBuildCannotReachHost(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()

	var hits atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.NotFound(w, r)
	}))
	defer evil.Close()
	secretDir := t.TempDir()
	secret := filepath.Join(secretDir, "secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)

	for _, tc := range []struct{ name, body, want string }{
		{"client mirror", `{"name":"evil","debian":"jammy","mirror":"` + evil.URL + `/evil"}`, "operator"},
		{"host directory", `{"name":"evil","rootfs":"` + secretDir + `"}`, "import-dir"},
		{"host file", `{"name":"evil","rootfs":"` + secret + `"}`, "import-dir"},
		{"proc root", `{"name":"evil","rootfs":"/proc/1/root/etc"}`, "import-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.rawRequest(t, "POST", "/agentenv/templates", testKey, strings.NewReader(tc.body))
			msg, _ := body["message"].(string)
			if status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("got %d %q, want 400 mentioning %q", status, msg, tc.want)
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the client's mirror got %d requests, want none", n)
	}
	if ts, err := e.client.ListTemplates(ctx); err == nil {
		for _, tpl := range ts {
			if tpl.TemplateID == "evil" {
				t.Errorf("a refused build left template evil")
			}
		}
	}

	// An upload with links out of the tree: built (or refused), the host
	// untouched, and a sandbox from it runs with its own files.
	victim := t.TempDir()
	os.WriteFile(filepath.Join(victim, "hosts"), []byte("10.9.9.9 victim\n"), 0o600)
	os.Chmod(victim, 0o700)
	stBefore, _ := os.Stat(victim)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox: %v", err)
	}
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, string(bb))
	for _, applet := range []string{"sh", "cat", "ls", "true", "stat"} {
		add(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"}, "")
	}
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "etc/hosts", Typeflag: tar.TypeSymlink, Linkname: filepath.Join(victim, "hosts")}, "")
	add(&tar.Header{Name: "home/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "home/user", Typeflag: tar.TypeSymlink, Linkname: victim}, "")
	add(&tar.Header{Name: "dev/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "dev/sda", Typeflag: tar.TypeBlock, Mode: 0o666}, "")
	tw.Close()
	_, err = e.client.UploadTemplate(ctx, "uploaded-evil", bytes.NewReader(buf.Bytes()), func(client.BuildProgress) {})
	if err == nil {
		defer e.client.DeleteTemplate(ctx, "uploaded-evil")
	}
	b, _ := os.ReadFile(filepath.Join(victim, "hosts"))
	stAfter, _ := os.Stat(victim)
	if string(b) != "10.9.9.9 victim\n" || stAfter.Mode() != stBefore.Mode() {
		t.Errorf("host files changed by an upload: hosts %q, dir mode %v -> %v", b, stBefore.Mode(), stAfter.Mode())
	}
	var ce *client.Error
	if err == nil {
		t.Logf("upload with links out built (links stay links)")
	} else if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest {
		t.Errorf("upload with links out: got %v, want it built or refused with 400", err)
	}
}

// TestUploadedTemplateRuns: a rootfs uploaded as a tarball (the CLI's
// --rootfs) becomes a template sandboxes start from.
func TestUploadedTemplateRuns(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "bin"), 0o755)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no /bin/busybox: %v", err)
	}
	os.WriteFile(filepath.Join(src, "bin", "busybox"), bb, 0o755)
	for _, applet := range []string{"sh", "cat", "true", "id"} {
		os.Symlink("busybox", filepath.Join(src, "bin", applet))
	}
	os.MkdirAll(filepath.Join(src, "srv"), 0o755)
	os.WriteFile(filepath.Join(src, "srv", "hello"), []byte("uploaded hello\n"), 0o644)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(template.WriteTar(ctx, pw, src)) }()
	tpl, err := e.client.UploadTemplate(ctx, "uploaded", pr, func(client.BuildProgress) {})
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	defer e.client.DeleteTemplate(ctx, "uploaded")
	if tpl.Source != "upload" {
		t.Errorf("got source %q, want upload", tpl.Source)
	}
	sb := e.create(t, client.CreateRequest{TemplateID: "uploaded"})
	res := e.sh(t, sb, "cat /srv/hello")
	if got, want := string(res.Stdout), "uploaded hello\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	e.client.KillSandbox(ctx, sb.SandboxID)
}

// TestReservedSnapshotNames: user snapshots cannot take the names of the
// server's ready snapshots (GC skips any "ready:*" name, so such a user
// snapshot would never be collected).
func TestReservedSnapshotNames(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{})
	status, body := e.rawRequest(t, "POST", "/sandboxes/"+sb.SandboxID+"/snapshots", testKey, strings.NewReader(`{"name":"ready:busybox"}`))
	if msg, _ := body["message"].(string); status != http.StatusBadRequest || !strings.Contains(msg, "reserved") {
		t.Errorf("got %d %v, want 400 saying the name is reserved", status, body)
	}
}

// TestManyProcessesDoNotKillTheSandbox: a user starting processes until
// the limit must see forks fail inside the sandbox, not the sandbox die
// because the host memory cgroup was hit first (900 sleeps of "user" once
// killed a 512 MiB sandbox).
func TestManyProcessesDoNotKillTheSandbox(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{Timeout: new(int64(300))})
	cg := "/sys/fs/cgroup/memory/agentenv/" + sb.SandboxID + "/memory.usage_in_bytes"
	usage := func() int64 {
		b, _ := os.ReadFile(cg)
		var n int64
		fmt.Sscan(string(b), &n)
		return n
	}
	before := usage()
	res := e.sh(t, sb, `i=0; while [ $i -lt 200 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done; echo ok`)
	mid := usage()
	t.Logf("host memory of the sandbox: %d MiB idle, %d MiB with 200 sleeps (%.0f KiB each): %s", before>>20, mid>>20, float64(mid-before)/200/1024, res.Stdout)
	res = e.sh(t, sb, `i=0; while [ $i -lt 1000 ]; do sleep 1000 >/dev/null 2>&1 & i=$((i+1)); done; echo ok`)
	t.Logf("after 1000 more: %d MiB; %q / %q", usage()>>20, res.Stdout, res.Stderr)
	if !strings.Contains(string(res.Stderr), "fork") && !strings.Contains(string(res.Stderr), "Resource") {
		t.Errorf("starting 1200 processes: stderr %q, want forks refused inside the sandbox", res.Stderr)
	}
	res = e.sh(t, sb, `echo alive`)
	if string(res.Stdout) != "alive\n" {
		t.Fatalf("sandbox after many processes: got %q, want alive", res.Stdout)
	}
}
