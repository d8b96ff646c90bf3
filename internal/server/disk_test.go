package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// diskTemplate builds (once per server) a busybox template whose sandboxes
// get a write layer of diskMB.
func diskTemplate(t *testing.T, e *env, diskMB int) string {
	t.Helper()
	name := fmt.Sprintf("busybox-disk%d", diskMB)
	ctx := context.Background()
	if tpls, err := e.client.ListTemplates(ctx); err == nil {
		for _, tp := range tpls {
			if tp.TemplateID == name {
				return name
			}
		}
	}
	tpl, err := e.client.BuildTemplate(ctx, client.BuildRequest{Name: name, Busybox: true, DiskMB: diskMB}, func(client.BuildProgress) {})
	if err != nil {
		t.Fatalf("build template with --disk-mb %d: %v", diskMB, err)
	}
	if tpl.DiskSizeMB != diskMB {
		t.Errorf("template diskSizeMB = %d, want %d", tpl.DiskSizeMB, diskMB)
	}
	return name
}

// dfRoot returns the size and use of / inside sb in KiB, as df shows them.
func dfRoot(t *testing.T, e *env, sb client.Sandbox, path string) (size, used int64) {
	t.Helper()
	res := e.sh(t, sb, "df -k "+path+" | tail -n 1")
	f := strings.Fields(string(res.Stdout))
	if len(f) < 3 {
		t.Fatalf("df -k %s: %q (stderr %q)", path, res.Stdout, res.Stderr)
	}
	size, _ = strconv.ParseInt(f[1], 10, 64)
	used, _ = strconv.ParseInt(f[2], 10, 64)
	return size, used
}

// TestDiskFullGivesENOSPC: writing past the write layer's size fails with
// ENOSPC inside the sandbox, which keeps answering (it used to be killed:
// the layer was in memory), and df shows the configured size.
func TestDiskFullGivesENOSPC(t *testing.T) {
	e := sharedServer(t)
	sb := e.create(t, client.CreateRequest{TemplateID: diskTemplate(t, e, 1024)})
	if size, _ := dfRoot(t, e, sb, "/"); size != 1024<<10 {
		t.Errorf("df / inside a 1024 MiB sandbox: size %d KiB, want %d", size, 1024<<10)
	}
	if size, _ := dfRoot(t, e, sb, "/tmp"); size != 1024<<10 {
		t.Errorf("df /tmp: size %d KiB, want %d (/tmp must be on the write layer, not in memory)", size, 1024<<10)
	}
	res := e.sh(t, sb, "dd if=/dev/zero of=/tmp/big bs=1M count=2048")
	if res.ExitCode == 0 || !strings.Contains(string(res.Stderr), "No space left on device") {
		t.Fatalf("dd of 2 GiB into 1 GiB: exit %d, stderr %q; want ENOSPC", res.ExitCode, res.Stderr)
	}
	if got := e.sh(t, sb, "echo alive"); strings.TrimSpace(string(got.Stdout)) != "alive" {
		t.Fatalf("after ENOSPC the sandbox answered %q", got.Stdout)
	}
	if _, err := e.client.GetSandbox(context.Background(), sb.SandboxID); err != nil {
		t.Fatalf("get after ENOSPC: %v", err)
	}
	// Deleting frees the layer for new writes.
	if res := e.sh(t, sb, "rm /tmp/big && dd if=/dev/zero of=/tmp/again bs=1M count=100"); res.ExitCode != 0 {
		t.Fatalf("write after freeing the layer: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}

	// The default size: the server's (--disk-mb).
	def := e.create(t, client.CreateRequest{})
	if size, _ := dfRoot(t, e, def, "/"); size != int64(sandbox.DefaultDiskMB)<<10 {
		t.Errorf("df / with the server's default: size %d KiB, want %d", size, sandbox.DefaultDiskMB<<10)
	}
	got, err := e.client.GetSandbox(context.Background(), def.SandboxID)
	if err != nil || got.DiskSizeMB != sandbox.DefaultDiskMB {
		t.Errorf("GET sandbox: diskSizeMB %d (err %v), want %d", got.DiskSizeMB, err, sandbox.DefaultDiskMB)
	}
}

// TestDiskWritesAreNotInMemory: 20 sandboxes each writing 200 MiB raise
// neither their cgroups' anonymous and shared memory nor the host's
// AnonPages+Shmem by anything near the 4 GiB written: the bytes are in
// page cache of the layer files, which the kernel writes back and drops.
func TestDiskWritesAreNotInMemory(t *testing.T) {
	e := sharedServer(t)
	if testing.Short() {
		t.Skip("writes 4 GiB")
	}
	const n, mb = 20, 200
	before := hostMem(t)
	sbs := make([]client.Sandbox, n)
	for i := range sbs {
		sbs[i] = e.create(t, client.CreateRequest{})
	}
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for _, sb := range sbs {
		wg.Go(func() {
			ctx := context.Background()
			res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", fmt.Sprintf("dd if=/dev/zero of=/home/user/fill bs=1M count=%d && sync", mb)}, nil, nil)
			if err != nil || res.ExitCode != 0 {
				errs <- fmt.Sprintf("%s: exit %d, err %v, stderr %q", sb.SandboxID, res.ExitCode, err, res.Stderr)
			}
		})
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Errorf("write %d MiB: %s", mb, msg)
	}
	after := hostMem(t)
	var inMem, onDisk int64
	for _, sb := range sbs {
		st := cgroupStat(t, sb.SandboxID)
		inMem += st["total_rss"] + st["total_shmem"]
		onDisk += layerBytes(e, sb.SandboxID)
	}
	t.Logf("%d sandboxes × %d MiB: cgroups' anon+shmem %d MiB; host AnonPages+Shmem %+d MiB; layer files on disk %d MiB",
		n, mb, inMem>>20, (after-before)>>20, onDisk>>20)
	if onDisk < n*mb<<20 {
		t.Errorf("layer files hold %d MiB, want at least %d MiB: the writes are not on disk", onDisk>>20, n*mb)
	}
	// Idle busybox sandboxes hold ~15 MiB of anonymous memory each.
	if inMem > 1<<30 {
		t.Errorf("the sandboxes' cgroups hold %d MiB of anonymous and shared memory after writing %d MiB: writes sit in RAM", inMem>>20, n*mb)
	}
	// The host figure is shared with whatever else runs: only a gross
	// failure (most of the 4 GiB in RAM) is told apart from noise.
	if d := after - before; d > 2<<30 {
		t.Errorf("host AnonPages+Shmem rose by %d MiB after writing %d MiB to disk layers", d>>20, n*mb)
	}
}

// TestForkSharesTheWriteLayer: fork children see the parent's files as of
// the fork, and each only its own writes after it; the parent sees none of
// theirs. Killing a sandbox frees its layer file at once.
func TestForkSharesTheWriteLayer(t *testing.T) {
	e := sharedServer(t)
	ctx := context.Background()
	parent := e.create(t, client.CreateRequest{})
	if res := e.sh(t, parent, "echo parent > /home/user/p && dd if=/dev/urandom of=/tmp/blob bs=1M count=50 2>/dev/null && md5sum /tmp/blob | cut -d' ' -f1"); res.ExitCode != 0 {
		t.Fatalf("parent write: %q", res.Stderr)
	}
	sum := strings.TrimSpace(string(e.sh(t, parent, "md5sum /tmp/blob | cut -d' ' -f1").Stdout))
	kids := e.fork(t, e.client, parent.SandboxID, 2)
	for i, k := range kids {
		e.sh(t, k, fmt.Sprintf("echo %d > /home/user/child%d; echo changed > /home/user/p.%d", i, i, i))
	}
	for i, k := range kids {
		got := string(e.sh(t, k, "cat /home/user/p; md5sum /tmp/blob | cut -d' ' -f1; ls /home/user").Stdout)
		want := fmt.Sprintf("parent\n%s\nchild%d\np\np.%d\n", sum, i, i)
		if got != want {
			t.Errorf("child %d sees %q, want %q (the parent's files and its own writes only)", i, got, want)
		}
	}
	if got := string(e.sh(t, parent, "ls /home/user").Stdout); got != "p\n" {
		t.Errorf("parent sees %q in /home/user after the children wrote, want only %q", got, "p\n")
	}

	// Kill frees the layer: its file is gone with the teardown.
	k := kids[0]
	layer := ocispec.FilestorePath(filepath.Join(e.dataDir, "sandboxes", k.SandboxID), k.SandboxID)
	if b := layerBytes(e, k.SandboxID); b < 50<<20 {
		t.Fatalf("child's layer file %s holds %d bytes, want ≥ 50 MiB", layer, b)
	}
	if err := e.client.KillSandbox(ctx, k.SandboxID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if left := e.leftovers(k, ""); len(left) > 0 {
		t.Fatalf("killed sandbox left %v", left)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Errorf("layer file %s after kill: %v, want it gone", layer, err)
	}
}

// layerBytes is the disk a sandbox's layer file takes on the host.
func layerBytes(e *env, id string) int64 {
	fi, err := os.Stat(ocispec.FilestorePath(filepath.Join(e.dataDir, "sandboxes", id), id))
	if err != nil {
		return 0
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// hostMem is the host's AnonPages + Shmem in bytes.
func hostMem(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var sum int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && (fs[0] == "AnonPages:" || fs[0] == "Shmem:") {
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			sum += kb << 10
		}
	}
	return sum
}

// cgroupStat reads a sandbox's memory cgroup statistics (v1 or v2 names).
func cgroupStat(t *testing.T, id string) map[string]int64 {
	t.Helper()
	paths, _ := filepath.Glob("/sys/fs/cgroup/memory/agentenv/" + id + "/memory.stat")
	if len(paths) == 0 {
		paths, _ = filepath.Glob("/sys/fs/cgroup/agentenv/" + id + "/memory.stat")
	}
	if len(paths) == 0 {
		t.Fatalf("no memory cgroup for sandbox %s", id)
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			out[k] = n
		}
	}
	if _, ok := out["total_rss"]; !ok {
		// cgroup v2
		out["total_rss"], out["total_shmem"] = out["anon"], out["shmem"]
	}
	return out
}

// TestDiskSizeBadInput: a template's disk size out of range, or not a
// number, is refused with 400 and says what to give.
func TestDiskSizeBadInput(t *testing.T) {
	e := sharedServer(t)
	for _, tc := range []struct{ name, path, body string }{
		{"too small", "/agentenv/templates", `{"name":"disk-bad","busybox":true,"diskMB":10}`},
		{"negative", "/agentenv/templates", `{"name":"disk-bad","busybox":true,"diskMB":-1}`},
		{"too big", "/agentenv/templates", `{"name":"disk-bad","busybox":true,"diskMB":2000000}`},
		{"upload not a number", "/agentenv/templates/disk-bad/rootfs?diskMB=ten", ``},
		{"upload too small", "/agentenv/templates/disk-bad/rootfs?diskMB=1", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.rawRequest(t, http.MethodPost, tc.path, testKey, strings.NewReader(tc.body))
			msg, _ := body["message"].(string)
			if status != http.StatusBadRequest || !strings.Contains(msg, "diskMB") {
				t.Errorf("POST %s %s: %d %q, want 400 naming diskMB", tc.path, tc.body, status, msg)
			}
		})
	}
}
