package server_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// loopFS mounts a fresh ext4 file system of size bytes (a loop device over
// a sparse file) and returns its mount point, unmounted when the test ends.
func loopFS(t *testing.T, size int64) string {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedCommand(t, "mkfs.ext4", "makes the test's small data filesystem (package e2fsprogs)")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"mkfs.ext4", "-q", "-F", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			out, err := exec.Command("umount", mnt).CombinedOutput()
			if err == nil {
				return
			}
			if i == 50 {
				t.Errorf("umount %s: %v: %s (detaching it)", mnt, err, out)
				exec.Command("umount", "-l", mnt).Run()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return mnt
}

// availBytes is what ordinary writers may still write on path's file
// system.
func availBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}

// wantStatus checks that err is the server's answer with HTTP status code.
func wantStatus(t *testing.T, what string, err error, code int) *client.Error {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != code {
		t.Fatalf("%s: got %v, want HTTP %d", what, err, code)
	}
	return ce
}

// TestDiskBudget: on a 768 MiB data filesystem with a 64 MiB reserve and
// a budget of 90 %, one sandbox filling its write layer gets ENOSPC inside
// it while the others and creates go on; a client's diskMB beyond
// --max-disk-mb gets 400; once the filesystem is near its reserve, creates
// and a snapshot get 507 and leave nothing behind; a sandbox that writes
// past what the host has left gets ENOSPC inside and stays alive (layers
// are thin: together they may promise more than the disk has); a kill
// makes room at once; a gzip bomb upload is stopped while it unpacks and
// leaves nothing.
func TestDiskBudget(t *testing.T) {
	testenv.NeedRunsc(t)
	mnt := loopFS(t, 768<<20)
	data := filepath.Join(mnt, "agentenv")
	const layerMB = 128
	const reserve = 64 << 20
	// The log stays off the test's filesystem, which must unmount.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("server log (last 8 KiB): %s", b[max(0, len(b)-8<<10):])
		}
		logFile.Close()
	})
	e := startServerWith(t, data, "10.127.0.0/20", "dsk", func(c *server.Config) {
		c.Log = slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.DiskBudget = sandbox.DiskBudget{Percent: 90}
		c.DiskReserve = sandbox.DiskReserve{Bytes: reserve}
		c.Limits.DefaultDiskMB = layerMB
		c.Limits.HotPool = 0
		c.ReadyTemplates, c.WarmPool = false, 0
		c.TemplateOptions.MaxDiskMB = 256
	})
	ctx := context.Background()
	var live []client.Sandbox
	ballast := filepath.Join(mnt, "ballast")
	t.Cleanup(func() {
		for _, sb := range live {
			e.client.KillSandbox(ctx, sb.SandboxID)
		}
		if err := e.stop(); err != nil {
			t.Error(err)
		}
		os.Remove(ballast)
	})
	create := func() (client.Sandbox, error) {
		sb, err := e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: new(int64(600))})
		if err == nil {
			live = append(live, sb)
		}
		return sb, err
	}
	kill := func(sb client.Sandbox) {
		if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
			t.Fatalf("kill: %v", err)
		}
		live = slices.DeleteFunc(live, func(s client.Sandbox) bool { return s.SandboxID == sb.SandboxID })
	}
	fill := func(sb client.Sandbox, mb int) {
		t.Helper()
		res := e.sh(t, sb, fmt.Sprintf("dd if=/dev/zero of=/tmp/fill bs=1M count=%d", mb))
		if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
			t.Fatalf("dd of %d MiB: exit %d, stderr %q; want ENOSPC inside", mb, res.ExitCode, res.Stderr)
		}
		if got := e.sh(t, sb, "echo alive"); strings.TrimSpace(string(got.Stdout)) != "alive" {
			t.Fatalf("after ENOSPC the sandbox answered %q", got.Stdout)
		}
	}

	// A client's diskMB is the operator's to bound.
	for _, mb := range []int{257, template.MaxDiskMB} {
		_, err := e.client.BuildTemplate(ctx, client.BuildRequest{Name: "huge", Busybox: true, DiskMB: mb}, func(client.BuildProgress) {})
		wantStatus(t, fmt.Sprintf("template with diskMB %d (--max-disk-mb 256)", mb), err, 400)
	}

	// One sandbox fills its layer: ENOSPC inside it only.
	a, err := create()
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	b, err := create()
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	fill(a, 1024)
	if res := e.sh(t, b, "dd if=/dev/zero of=/tmp/some bs=1M count=32"); res.ExitCode != 0 {
		t.Fatalf("another sandbox's write after the first filled its layer: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	if _, err := create(); err != nil {
		t.Fatalf("create after a sandbox filled its layer: %v", err)
	}

	// Near the reserve: creates and snapshots get 507, nothing left behind.
	leaveFree(t, mnt, ballast, reserve+4<<20)
	_, full := create()
	ce := wantStatus(t, "create 4 MiB above the reserve", full, 507)
	for _, want := range []string{"no room", "kill sandboxes", "--disk-reserve"} {
		if !strings.Contains(ce.Message, want) {
			t.Errorf("507 message %q lacks %q", ce.Message, want)
		}
	}
	t.Logf("%d sandboxes; then: %s", len(live), ce.Message)
	dirs, _ := os.ReadDir(filepath.Join(data, "sandboxes"))
	var ids, want []string
	for _, d := range dirs {
		ids = append(ids, d.Name())
	}
	for _, sb := range live {
		want = append(want, sb.SandboxID)
	}
	slices.Sort(ids)
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("sandbox directories after the refused create: %v, want the live ones %v", ids, want)
	}
	if ns := namespaces("dsk"); len(ns) > testSlotPool+len(live) {
		t.Errorf("%d network namespaces for %d sandboxes and a pool of %d", len(ns), len(live), testSlotPool)
	}
	_, err = e.client.SnapshotSandbox(ctx, b.SandboxID, "", nil)
	wantStatus(t, "snapshot near the reserve", err, 507)

	// Thin layers promise more than the disk has: a sandbox writing past
	// what the host has left gets ENOSPC inside and lives on.
	leaveFree(t, mnt, ballast, 32<<20)
	fill(b, 100)
	syncFS()
	t.Logf("a sandbox wrote until the host's disk was full: %d KiB left", availBytes(t, mnt)>>10)

	// A kill makes room at once: its layer counts as freed by the time
	// the kill answers.
	os.Remove(ballast)
	leaveFree(t, mnt, ballast, reserve+4<<20)
	kill(a)
	if _, err := create(); err != nil {
		t.Fatalf("create right after killing a sandbox that held %d MiB: %v", layerMB, err)
	}

	// A gzip bomb (a few MB that expand to 2 GiB) is stopped while it
	// unpacks: 507, not listed, its files gone.
	os.Remove(ballast)
	for _, sb := range slices.Clone(live) {
		kill(sb)
	}
	tplDir := filepath.Join(data, "templates")
	before := template.DiskUsage(tplDir)
	_, err = e.client.UploadTemplate(ctx, "bomb", gzipBomb(t, 2048, 1<<20), func(client.BuildProgress) {})
	ce = wantStatus(t, "upload of a gzip bomb", err, 507)
	t.Logf("bomb: %s", ce.Message)
	tpls, err := e.client.ListTemplates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range tpls {
		if tp.TemplateID == "bomb" {
			t.Errorf("the refused template is listed")
		}
	}
	entries, _ := os.ReadDir(tplDir)
	for _, en := range entries {
		if (strings.HasPrefix(en.Name(), ".") && en.Name() != ".images") || en.Name() == "bomb" {
			t.Errorf("the refused build left %s in the templates directory", en.Name())
		}
	}
	if left, _ := filepath.Glob(filepath.Join(tplDir, ".images", "bomb.*")); len(left) > 0 {
		t.Errorf("the refused build left its image: %v", left)
	}
	if after := template.DiskUsage(tplDir); after > before+1<<20 {
		t.Errorf("templates take %d bytes after the refused build, %d before", after, before)
	}
}

// gzipBomb streams a gzip'd tar of n files of size bytes of zeros; the
// writer stops when the test ends.
func gzipBomb(t *testing.T, n int, size int64) io.Reader {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pr.Close() })
	go func() {
		gz, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		tw := tar.NewWriter(gz)
		buf := make([]byte, size)
		var err error
		for i := 0; i < n && err == nil; i++ {
			if err = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%05d", i), Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err == nil {
				_, err = tw.Write(buf)
			}
		}
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = gz.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}
