package cgroupstat

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadV1(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{
		"cpuacct/agentenv/x/cpuacct.usage":        "1500000000\n",
		"memory/agentenv/x/memory.usage_in_bytes": "300000000\n",
		"memory/agentenv/x/memory.limit_in_bytes": "536870912\n",
		"memory/agentenv/x/memory.stat":           "cache 9\ntotal_cache 120000000\ntotal_shmem 100000000\ntotal_inactive_file 5000000\n",
		"memory/agentenv/x/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
	})
	got, err := readV1(root, "/agentenv/x")
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Stats{CPU: 1500 * time.Millisecond, MemUsed: 295000000, MemLimit: 536870912, MemCache: 20000000, OOMKills: 2}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	write(t, root, map[string]string{"memory/agentenv/x/memory.limit_in_bytes": "9223372036854771712\n"})
	if got, _ := readV1(root, "/agentenv/x"); got.MemLimit != 0 {
		t.Errorf("unlimited: got limit %d, want 0", got.MemLimit)
	}
	if _, err := readV1(root, "/agentenv/gone"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing cgroup: got %v, want not exist", err)
	}
}

func TestReadV2(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, map[string]string{
		"cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\n",
		"memory.current": "400000000\n",
		"memory.max":     "max\n",
		"memory.stat":    "anon 1\nfile 150000000\nshmem 100000000\ninactive_file 10000000\n",
		"memory.events":  "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
	})
	got, err := readV2(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := runtime.Stats{CPU: 2500 * time.Millisecond, MemUsed: 390000000, MemCache: 50000000, OOMKills: 1}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestReadMissingCgroupIsNotFound(t *testing.T) {
	if _, err := os.Stat(Root); err != nil {
		t.Skipf("no %s on this host", Root)
	}
	if _, err := Read(Root, "/agentenv/no-such-sandbox-0000"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
}
