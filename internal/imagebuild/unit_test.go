package imagebuild

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestStaticPrefix(t *testing.T) {
	for _, c := range []struct {
		src, want string
		globbed   bool
	}{
		{"app", "app", false},
		{"./app/", "app", false},
		{"app/*.py", "app", true},
		{"**/*.txt", ".", true},
		{"a/b/{x,y}", "a/b", true},
		{"../etc", "", false},
		{"a/../../etc", "", false},
		{"/etc/passwd", "", false},
	} {
		got, globbed := staticPrefix(c.src)
		if got != c.want || globbed != c.globbed {
			t.Errorf("staticPrefix(%q) = %q, %v; want %q, %v", c.src, got, globbed, c.want, c.globbed)
		}
	}
}

func TestLayerKey(t *testing.T) {
	base := layerKey("o", "p", Step{Type: "RUN", Args: []string{"echo a"}})
	for name, other := range map[string]string{
		"parent": layerKey("o", "q", Step{Type: "RUN", Args: []string{"echo a"}}),
		"type":   layerKey("o", "p", Step{Type: "ENV", Args: []string{"echo a"}}),
		"args":   layerKey("o", "p", Step{Type: "RUN", Args: []string{"echo b"}}),
		"files":  layerKey("o", "p", Step{Type: "RUN", Args: []string{"echo a"}, FilesHash: "h"}),
		"owner":  layerKey("", "p", Step{Type: "RUN", Args: []string{"echo a"}}),
	} {
		if other == base {
			t.Errorf("a different %s gives the same key", name)
		}
	}
	if layerKey("o", "p", Step{Type: "RUN", Args: []string{"echo a"}, Force: true}) != base {
		t.Error("Force changed the key")
	}
}

func TestApplyEnv(t *testing.T) {
	st := state{Env: map[string]string{"HOME": "/h"}}
	if err := applyEnv(&st, []string{"A", "$HOME/x", "B", "${A}:$MISSING:$$"}); err != nil {
		t.Fatal(err)
	}
	if st.Env["A"] != "/h/x" || st.Env["B"] != "/h/x::" {
		t.Errorf("got A=%q B=%q", st.Env["A"], st.Env["B"])
	}
	if err := applyEnv(&st, []string{"1BAD", "x"}); err == nil {
		t.Error("a bad variable name was accepted")
	}
}

func TestReach(t *testing.T) {
	for _, c := range []struct {
		ip     string
		public bool
	}{
		{"8.8.8.8", true}, {"2606:4700::1", true},
		{"127.0.0.1", false}, {"10.1.2.3", false}, {"192.168.1.1", false}, {"172.16.0.1", false},
		{"169.254.169.254", false}, {"100.64.0.1", false}, {"::1", false}, {"fe80::1", false},
		{"fd00::1", false}, {"0.0.0.0", false}, {"::ffff:127.0.0.1", false},
	} {
		if got := public(netip.MustParseAddr(c.ip)); got != c.public {
			t.Errorf("public(%s) = %v, want %v", c.ip, got, c.public)
		}
	}
	r := newReach([]string{"127.0.0.1:5000", "registry.lan"}, "")
	if !r.listed("127.0.0.1:5000") || !r.listed("REGISTRY.lan:443") || r.listed("127.0.0.1:5001") {
		t.Error("listed: wrong answer for the allow list")
	}
	_, err := r.dial(context.Background(), "tcp", "127.0.0.1:5001")
	if err == nil || !strings.Contains(err.Error(), "--registry-allow 127.0.0.1:5001") {
		t.Errorf("dial of an unlisted loopback registry: got %v, want a refusal naming --registry-allow", err)
	}
	_, err = r.dial(context.Background(), "tcp", "localhost:5001")
	if err == nil || !strings.Contains(err.Error(), "--registry-allow") {
		t.Errorf("dial of localhost: got %v, want a refusal", err)
	}
}

func TestMirror(t *testing.T) {
	b := &Builder{cfg: Config{Mirror: "mirror.example:5000"}, reach: newReach(nil, "mirror.example:5000")}
	for ref, want := range map[string]string{
		"debian:stable":            "mirror.example:5000/library/debian:stable",
		"docker.io/team/app:1":     "mirror.example:5000/team/app:1",
		"ghcr.io/team/app:1":       "ghcr.io/team/app:1",
		"python@sha256:" + hex64(): "mirror.example:5000/library/python@sha256:" + hex64(),
	} {
		r, err := b.reference(ref)
		if err != nil || r.String() != want {
			t.Errorf("reference(%q) = %v, %v; want %s", ref, r, err, want)
		}
	}
}

func hex64() string { return strings.Repeat("ab", 32) }

// A build's sandboxes get the server's limits unless it asks for its
// own; more CPUs or memory than the server gives is refused.
func TestLimitsFor(t *testing.T) {
	b := &Builder{cfg: Config{Limits: Limits{Pids: 1024}.withDefaults()}}
	cases := []struct {
		spec     Spec
		cpus, mb int
		pids     int64
		err      bool
	}{
		{Spec{}, DefaultLimits.CPUs, DefaultLimits.MemoryMB, 1024, false},
		{Spec{CPUs: 4, MemoryMB: 4096}, 4, 4096, 1024, false},
		// Small memory lowers the process cap, to 32 at least.
		{Spec{MemoryMB: 128}, DefaultLimits.CPUs, 128, 124, false},
		{Spec{MemoryMB: 16}, DefaultLimits.CPUs, 16, 32, false},
		{Spec{MemoryMB: DefaultLimits.MaxMemoryMB + 1}, 0, 0, 0, true},
		{Spec{CPUs: DefaultLimits.MaxCPUs}, DefaultLimits.MaxCPUs, DefaultLimits.MemoryMB, 1024, false},
		{Spec{CPUs: DefaultLimits.MaxCPUs + 1}, 0, 0, 0, true},
	}
	for _, c := range cases {
		got, err := b.limitsFor(c.spec)
		if c.err {
			if err == nil {
				t.Errorf("limitsFor(%+v): got %+v, want an error", c.spec, got)
			}
			continue
		}
		if err != nil || got.cpus != c.cpus || got.memoryMB != c.mb || got.pids != c.pids {
			t.Errorf("limitsFor(cpus %d, memory %d) = %+v, %v; want cpus %d, memory %d, pids %d", c.spec.CPUs, c.spec.MemoryMB, got, err, c.cpus, c.mb, c.pids)
		}
	}
}

// A build's CPUs and memory become its sandbox's cgroup limits: the CPU
// quota (gVisor shows a sandbox at least 2 CPUs whatever its quota, so
// the quota is what bounds a 1-CPU build) and the memory limit.
func TestLimitsApply(t *testing.T) {
	b := &Builder{cfg: Config{Limits: Limits{Pids: 1024}.withDefaults()}}
	l, err := b.limitsFor(Spec{CPUs: 1, MemoryMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	l.apply(spec)
	r := spec.Linux.Resources
	if r == nil || r.CPU == nil || r.CPU.Quota == nil || r.CPU.Period == nil || *r.CPU.Quota != int64(*r.CPU.Period) {
		t.Fatalf("CPU limits of a 1-CPU build = %+v, want a quota of one period", r)
	}
	if r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit != 1024<<20 {
		t.Errorf("memory limit of a 1024 MiB build = %+v, want %d bytes", r.Memory, 1024<<20)
	}
}
