// Package cgroupstat reads a sandbox's CPU and memory use from the host's
// cgroups (v1 or v2), for the gVisor runtimes' Stats. It only reads.
package cgroupstat

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
)

// Root is where the cgroup hierarchies are mounted.
const Root = "/sys/fs/cgroup"

// Read samples the cgroup at path rel (as in an OCI spec's cgroupsPath,
// e.g. "/agentenv/<id>") under root.
func Read(root, rel string) (runtime.Stats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return runtime.Stats{}, errdefs.Unavailable("no cgroups mounted at %s: %v", root, err)
	}
	var s runtime.Stats
	var err error
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		s, err = readV2(filepath.Join(root, rel))
	} else {
		s, err = readV1(root, rel)
	}
	if errors.Is(err, os.ErrNotExist) {
		return s, errdefs.NotFound("no cgroup %s: the sandbox is not running under cgroups here", rel)
	}
	return s, err
}

// readV1 reads the cpuacct and memory controllers.
func readV1(root, rel string) (runtime.Stats, error) {
	var s runtime.Stats
	ns, err := readInt(filepath.Join(root, "cpuacct", rel, "cpuacct.usage"))
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(ns)
	mem := filepath.Join(root, "memory", rel)
	usage, err := readInt(filepath.Join(mem, "memory.usage_in_bytes"))
	if err != nil {
		return s, err
	}
	if s.MemLimit, err = readInt(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return s, err
	}
	if s.MemLimit >= 1<<62 { // "unlimited" is the largest page-aligned int64
		s.MemLimit = 0
	}
	kv, err := readKV(filepath.Join(mem, "memory.stat"))
	if err != nil {
		return s, err
	}
	s.MemUsed = max(usage-kv["total_inactive_file"], 0)
	// gVisor's guest memory is a memfd: shmem, counted in cache but not
	// file page cache.
	s.MemCache = max(kv["total_cache"]-kv["total_shmem"], 0)
	// "oom_kill N" since Linux 4.13; older kernels give none (0).
	if oc, err := readKV(filepath.Join(mem, "memory.oom_control")); err == nil {
		s.OOMKills = oc["oom_kill"]
	}
	return s, nil
}

func readV2(dir string) (runtime.Stats, error) {
	var s runtime.Stats
	cpu, err := readKV(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(cpu["usage_usec"]) * time.Microsecond
	usage, err := readInt(filepath.Join(dir, "memory.current"))
	if err != nil {
		return s, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "memory.max")); err == nil && strings.TrimSpace(string(b)) != "max" {
		s.MemLimit, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	kv, err := readKV(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return s, err
	}
	s.MemUsed = max(usage-kv["inactive_file"], 0)
	s.MemCache = max(kv["file"]-kv["shmem"], 0)
	if ev, err := readKV(filepath.Join(dir, "memory.events")); err == nil {
		s.OOMKills = ev["oom_kill"]
	}
	return s, nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// readKV reads a "key value" per line file (memory.stat, cpu.stat).
func readKV(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, sc.Err()
}
