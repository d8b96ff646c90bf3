package imagebuild_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/imagebuild/imagebuildtest"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

var (
	envdOnce sync.Once
	envdBin  string
)

// env is one test's builder, template store and registry.
type env struct {
	t     *testing.T
	dir   string // the build cache
	store *template.Store
	b     *imagebuild.Builder
	host  string // the loopback registry
	ref   string // the two-layer GNU image in it
	cfg   imagebuild.Config
}

func newEnv(t *testing.T, allowRegistry bool) *env {
	t.Helper()
	runsc := testenv.NeedRunsc(t)
	testenv.NeedCommand(t, "mkfs.erofs", "writes template images (package erofs-utils)")
	envdOnce.Do(func() { envdBin = testenv.BuildEnvd(t, os.TempDir()) })
	if envdBin == "" {
		t.Fatal("envd build failed in an earlier test")
	}
	base := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := template.Open(filepath.Join(base, "templates"), envdBin, log)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: filepath.Join(base, "build"), store: store}
	e.host = imagebuildtest.Registry(t)
	e.ref = imagebuildtest.PushGNUImage(t, e.host, "gnu")
	cfg := imagebuild.Config{Dir: e.dir, Runsc: runsc, Templates: store, Log: log}
	if allowRegistry {
		cfg.Registries = []string{e.host}
	}
	e.cfg = cfg
	if e.b, err = imagebuild.New(cfg); err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.noLeftovers() })
	return e
}

// prepare runs Prepare and returns the request, the log and the cleanup
// (registered with t.Cleanup too).
func (e *env) prepare(ctx context.Context, spec imagebuild.Spec) (template.BuildRequest, []string, error) {
	var mu sync.Mutex
	var lines []string
	req, cleanup, err := e.b.Prepare(ctx, spec, func(l imagebuild.LogEntry) {
		mu.Lock()
		lines = append(lines, l.Message)
		mu.Unlock()
	})
	if cleanup != nil {
		e.t.Cleanup(cleanup)
	}
	return req, lines, err
}

// noLeftovers checks that no build left mounts, sandboxes, scratch or
// half-written entries under the cache.
func (e *env) noLeftovers() {
	t := e.t
	t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), e.dir) {
		t.Errorf("mounts left under %s:\n%s", e.dir, grepLines(string(mi), e.dir))
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(e.dir)) && bytes.Contains(b, []byte("runsc")) {
			t.Errorf("process left: %s", bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	for _, d := range []string{"scratch", "tmp"} {
		if ents, _ := os.ReadDir(filepath.Join(e.dir, d)); len(ents) > 0 {
			t.Errorf("%s/ not empty: %d entries", d, len(ents))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (e *env) layers() []string {
	ents, _ := os.ReadDir(filepath.Join(e.dir, "layers"))
	var out []string
	for _, d := range ents {
		out = append(out, d.Name())
	}
	return out
}

// archive is a COPY step's files: a tar of name -> body (a name ending
// in '/' is a directory).
func archive(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range files {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg, ModTime: time.Now()}
		if strings.HasSuffix(name, "/") {
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	return b.Bytes()
}

func filesFrom(m map[string][]byte) func(string) (io.ReadCloser, error) {
	return func(hash string) (io.ReadCloser, error) {
		b, ok := m[hash]
		if !ok {
			return nil, errors.New("no such files")
		}
		return io.NopCloser(bytes.NewReader(b)), nil
	}
}

func readTree(t *testing.T, tree, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tree, name))
	if err != nil {
		t.Errorf("read /%s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

func owner(t *testing.T, p string) (uid, gid uint32, mode os.FileMode) {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	s := st.Sys().(*syscall.Stat_t)
	return s.Uid, s.Gid, st.Mode()
}

// Every step type's effect on the tree, the state the template gets, and
// the round trip through the template store.
func TestStepsFromImage(t *testing.T) {
	e := newEnv(t, true)
	files := map[string][]byte{
		"dirhash": archive(t, map[string]string{"ctx/": "", "ctx/a.txt": "a\n", "ctx/sub/": "", "ctx/sub/b.txt": "b\n"}),
		"onehash": archive(t, map[string]string{"one.txt": "one\n"}),
	}
	spec := imagebuild.Spec{
		Name:      "steps",
		FromImage: e.ref,
		Files:     filesFrom(files),
		StartCmd:  "sleep infinity",
		Steps: []imagebuild.Step{
			{Type: "ENV", Args: []string{"A", "1", "B", "$A-x-${" + imagebuildtest.MarkerEnv + "}"}},
			{Type: "RUN", Args: []string{"mkdir -p /opt/merge && echo keep > /opt/merge/old", "root"}},
			{Type: "USER", Args: []string{"builder"}},
			{Type: "RUN", Args: []string{"id -u > /tmp/uid; echo \"$B\" > /tmp/b; echo $HOME > /tmp/home; echo hello from run"}},
			{Type: "COPY", Args: []string{"ctx", "/opt/merge", "root", "0600"}, FilesHash: "dirhash"},
			{Type: "WORKDIR", Args: []string{"/srv"}},
			{Type: "WORKDIR", Args: []string{"data"}},
			{Type: "COPY", Args: []string{"one.txt", "sub/"}, FilesHash: "onehash"},
			{Type: "RUN", Args: []string{"pwd > /tmp/pwd; id -un > /tmp/who", "root"}},
		},
	}
	start := time.Now()
	req, lines, err := e.prepare(context.Background(), spec)
	if err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, strings.Join(lines, "\n"))
	}
	t.Logf("cold Prepare of %d steps: %s", len(spec.Steps), time.Since(start))
	tree := req.Tree
	if !strings.Contains(strings.Join(lines, "\n"), "hello from run") {
		t.Errorf("log lacks the RUN output:\n%s", strings.Join(lines, "\n"))
	}
	passwd := readTree(t, tree, "etc/passwd")
	if !strings.Contains(passwd, "builder:x:1001:1001::/home/builder:/bin/bash") || !strings.Contains(passwd, "user:x:1000:") {
		t.Errorf("/etc/passwd = %q, want user (1000) and builder (1001)", passwd)
	}
	if got := readTree(t, tree, "tmp/uid"); got != "1001" {
		t.Errorf("RUN after USER builder: id -u = %q, want 1001", got)
	}
	if got, want := readTree(t, tree, "tmp/b"), "1-x-"+imagebuildtest.MarkerValue; got != want {
		t.Errorf("ENV expansion: $B = %q, want %q", got, want)
	}
	if got := readTree(t, tree, "tmp/home"); got != "/home/builder" {
		t.Errorf("HOME = %q, want /home/builder", got)
	}
	if uid, _, _ := owner(t, filepath.Join(tree, "home/builder")); uid != 1001 {
		t.Errorf("/home/builder owned by %d, want 1001", uid)
	}
	// COPY of a directory merges its contents into the existing one.
	if got := readTree(t, tree, "opt/merge/old"); got != "keep" {
		t.Errorf("merge lost /opt/merge/old: %q", got)
	}
	readTree(t, tree, "opt/merge/sub/b.txt")
	if got := readTree(t, tree, "opt/merge/a.txt"); got != "a" {
		t.Errorf("/opt/merge/a.txt = %q", got)
	}
	if uid, _, mode := owner(t, filepath.Join(tree, "opt/merge/a.txt")); uid != 0 || mode.Perm() != 0o600 {
		t.Errorf("/opt/merge/a.txt: owner %d mode %o, want 0 and 600", uid, mode.Perm())
	}
	// A relative dest ending in '/' is a directory under the workdir; the
	// default owner is the current user.
	if got := readTree(t, tree, "srv/data/sub/one.txt"); got != "one" {
		t.Errorf("/srv/data/sub/one.txt = %q", got)
	}
	if uid, _, _ := owner(t, filepath.Join(tree, "srv/data/sub/one.txt")); uid != 1001 {
		t.Errorf("COPY without owner: uid %d, want the current user's 1001", uid)
	}
	if uid, _, _ := owner(t, filepath.Join(tree, "srv/data")); uid != 1001 {
		t.Errorf("WORKDIR made /srv/data owned by %d, want 1001", uid)
	}
	if got := readTree(t, tree, "tmp/pwd"); got != "/srv/data" {
		t.Errorf("RUN cwd = %q, want /srv/data", got)
	}
	if got := readTree(t, tree, "tmp/who"); got != "root" {
		t.Errorf("RUN with user root ran as %q", got)
	}
	// The image's two layers: layer 2's file is there, its whiteout applied.
	if got := readTree(t, tree, imagebuildtest.Layer2File); got != strings.TrimSpace(imagebuildtest.Layer2Content) {
		t.Errorf("/%s = %q", imagebuildtest.Layer2File, got)
	}
	if _, err := os.Lstat(filepath.Join(tree, imagebuildtest.WhitedOut)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/%s: got %v, want it whited out", imagebuildtest.WhitedOut, err)
	}
	checkNoWhiteouts(t, tree)
	if req.User != "builder" || req.Workdir != "/srv/data" || req.Env["B"] != "1-x-"+imagebuildtest.MarkerValue ||
		req.Env[imagebuildtest.MarkerEnv] != imagebuildtest.MarkerValue || req.StartCmd != "sleep infinity" {
		t.Errorf("request defaults: user %q workdir %q env %v start %q", req.User, req.Workdir, req.Env, req.StartCmd)
	}
	// The tree becomes a template.
	tpl, err := e.store.Build(context.Background(), req, func(template.Progress) {})
	if err != nil {
		t.Fatalf("store.Build: %v", err)
	}
	if tpl.Source != "steps:"+e.ref || tpl.User != "builder" || tpl.Workdir != "/srv/data" {
		t.Errorf("template: source %q user %q workdir %q", tpl.Source, tpl.User, tpl.Workdir)
	}
	if _, err := os.Stat(e.store.ImagePath("steps")); err != nil {
		t.Errorf("image: %v", err)
	}
	if _, err := os.Stat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the tree was not moved into the store: %v", err)
	}
}

// checkNoWhiteouts fails on overlayfs whiteouts (0/0 character devices).
func checkNoWhiteouts(t *testing.T, tree string) {
	t.Helper()
	filepath.Walk(tree, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			t.Errorf("whiteout or device leaked into the tree: %s", p)
		}
		return nil
	})
}

// The second build with step 3 changed reuses steps 1-2; Force reruns.
func TestCache(t *testing.T) {
	e := newEnv(t, true)
	spec := func(third string) imagebuild.Spec {
		return imagebuild.Spec{Name: "cache", FromImage: e.ref, Steps: []imagebuild.Step{
			{Type: "RUN", Args: []string{"echo one > /one", "root"}},
			{Type: "ENV", Args: []string{"X", "y"}},
			{Type: "RUN", Args: []string{third, "root"}},
		}}
	}
	start := time.Now()
	if _, lines, err := e.prepare(context.Background(), spec("echo three > /three")); err != nil {
		t.Fatalf("cold: %v\n%s", err, strings.Join(lines, "\n"))
	}
	cold := time.Since(start)
	first := e.layers()
	if len(first) != 3 {
		t.Fatalf("got %d layers after a 3-step build, want 3", len(first))
	}
	start = time.Now()
	req, lines, err := e.prepare(context.Background(), spec("echo other > /three"))
	if err != nil {
		t.Fatalf("cached: %v", err)
	}
	t.Logf("Prepare: cold %s, with steps 1-2 cached %s", cold, time.Since(start))
	log := strings.Join(lines, "\n")
	for _, want := range []string{"CACHED [base] FROM", "CACHED [builder 1/3] RUN echo one", "CACHED [builder 2/3] ENV X=y", "\n[builder 3/3] RUN echo other"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if got := readTree(t, req.Tree, "three"); got != "other" {
		t.Errorf("/three = %q, want other", got)
	}
	if got := readTree(t, req.Tree, "one"); got != "one" {
		t.Errorf("/one = %q, want one", got)
	}
	if n := len(e.layers()); n != 4 {
		t.Errorf("got %d layers, want 4 (steps 1-2 reused)", n)
	}
	// A forced step reruns, and so does every later one.
	s := spec("echo other > /three")
	s.Steps[1].Force = true
	_, lines, err = e.prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	log = strings.Join(lines, "\n")
	if !strings.Contains(log, "CACHED [builder 1/3]") || strings.Contains(log, "CACHED [builder 2/3]") || strings.Contains(log, "CACHED [builder 3/3]") {
		t.Errorf("step 2 forced: want only step 1 cached:\n%s", log)
	}
	s.Steps[1].Force = false
	s.Force = true
	_, lines, err = e.prepare(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if log = strings.Join(lines, "\n"); strings.Contains(log, "CACHED") {
		t.Errorf("Spec.Force: want nothing cached:\n%s", log)
	}
}

// A failing RUN names its step, command and output, and leaves nothing:
// no mount, sandbox, scratch or half layer.
func TestFailingRun(t *testing.T) {
	e := newEnv(t, true)
	spec := imagebuild.Spec{Name: "fail", FromImage: e.ref, MemoryMB: 512, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"echo ok > /ok", "root"}},
		{Type: "RUN", Args: []string{"echo before; echo broken-thing >&2; exit 3"}},
	}}
	_, lines, err := e.prepare(context.Background(), spec)
	var se *imagebuild.StepError
	if !errors.As(err, &se) {
		t.Fatalf("got %v, want a *StepError", err)
	}
	if se.Step != 2 || se.Type != "RUN" || !strings.Contains(se.Command, "exit 3") ||
		!strings.Contains(se.Output, "broken-thing") || !strings.Contains(se.Err.Error(), "exit status 3") {
		t.Errorf("StepError: step %d type %s command %q output %q err %v", se.Step, se.Type, se.Command, se.Output, se.Err)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "broken-thing") {
		t.Errorf("log lacks the output:\n%s", strings.Join(lines, "\n"))
	}
	// A failed build leaves nothing: neither the failed step's layer nor
	// those of the steps before it, nor its base.
	if n := len(e.layers()); n != 0 {
		t.Errorf("got %d layers, want none", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "bases")); len(ents) > 0 {
		t.Errorf("bases/ has %d entries after a failed build", len(ents))
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "trees")); len(ents) > 0 {
		t.Errorf("trees/ has %d entries after a failed build", len(ents))
	}
	e.noLeftovers()
}

// Cancelling a build kills its sandbox.
func TestCancelRun(t *testing.T) {
	e := newEnv(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	spec := imagebuild.Spec{Name: "cancel", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"echo started; sleep 600"}},
	}}
	var once sync.Once
	_, cleanup, err := e.b.Prepare(ctx, spec, func(l imagebuild.LogEntry) {
		if l.Message == "started" {
			once.Do(func() { time.AfterFunc(200*time.Millisecond, cancel) })
		}
	})
	if cleanup != nil {
		cleanup()
	}
	var se *imagebuild.StepError
	if !errors.As(err, &se) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a StepError wrapping context.Canceled", err)
	}
	e.noLeftovers()
}

// A loopback registry is refused unless the operator listed it.
func TestRegistryRefused(t *testing.T) {
	e := newEnv(t, false)
	_, _, err := e.prepare(context.Background(), imagebuild.Spec{Name: "x", FromImage: e.ref})
	if err == nil || !strings.Contains(err.Error(), "--registry-allow") {
		t.Fatalf("got %v, want a refusal naming --registry-allow", err)
	}
}

// fromTemplate starts from a template's tree; an image imported with
// template build --oci resolves by reference without the registry.
func TestFromTemplateAndImported(t *testing.T) {
	e := newEnv(t, false) // the registry is not reachable
	// An "imported" image: a template whose source is oci:REF.
	var tarball bytes.Buffer
	gnu := t.TempDir()
	testenv.GNURootfs(t, gnu)
	os.WriteFile(filepath.Join(gnu, "imported"), []byte("yes\n"), 0o644)
	if err := template.WriteTar(context.Background(), &tarball, gnu); err != nil {
		t.Fatal(err)
	}
	ref := "registry.invalid/team/gnu:1"
	if _, err := e.store.Build(context.Background(), template.BuildRequest{Name: "imported", Upload: &tarball, Image: ref}, func(template.Progress) {}); err != nil {
		t.Fatal(err)
	}
	req, lines, err := e.prepare(context.Background(), imagebuild.Spec{Name: "child", FromImage: ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"cat /imported > /seen", "root"}},
	}})
	if err != nil {
		t.Fatalf("Prepare from an imported image: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if got := readTree(t, req.Tree, "seen"); got != "yes" {
		t.Errorf("/seen = %q", got)
	}
	if _, err := e.store.Build(context.Background(), req, func(template.Progress) {}); err != nil {
		t.Fatal(err)
	}
	req2, _, err := e.prepare(context.Background(), imagebuild.Spec{Name: "grandchild", FromTemplate: "child", Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"cat /seen /imported > /both", "root"}},
	}})
	if err != nil {
		t.Fatalf("Prepare fromTemplate: %v", err)
	}
	if got := readTree(t, req2.Tree, "both"); got != "yes\nyes" {
		t.Errorf("/both = %q", got)
	}
	if _, _, err := e.prepare(context.Background(), imagebuild.Spec{Name: "x", FromTemplate: "missing"}); err == nil {
		t.Error("fromTemplate of a missing template worked")
	}
}

// Concurrent builds of the same steps share the cache safely; the cache
// bound trims what no build holds.
func TestConcurrentAndTrim(t *testing.T) {
	e := newEnv(t, true)
	spec := imagebuild.Spec{Name: "conc", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"echo same > /same", "root"}},
	}}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	trees := make([]string, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var req template.BuildRequest
			req, _, errs[i] = e.prepare(context.Background(), spec)
			trees[i] = req.Tree
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		if got := readTree(t, trees[i], "same"); got != "same" {
			t.Errorf("build %d: /same = %q", i, got)
		}
	}
	if n := len(e.layers()); n != 1 {
		t.Errorf("got %d layers, want 1", n)
	}
	cfg := e.cfg
	cfg.MaxCacheBytes = 1
	small, err := imagebuild.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, cleanup, err := small.Prepare(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	cleanup()
	if n := len(e.layers()); n != 0 {
		t.Errorf("got %d layers after a trim to 1 byte, want 0", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.dir, "bases")); len(ents) != 0 {
		t.Errorf("got %d bases after a trim to 1 byte, want 0", len(ents))
	}
}

// New over the cache of a build that is still running (as after a crash
// of the process that ran it) removes its sandbox, mounts and scratch.
func TestRecoverAfterCrash(t *testing.T) {
	e := newEnv(t, true)
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	// Bounded, so a recovery that misses the sandbox fails the test
	// instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		_, cleanup, err := e.b.Prepare(ctx, imagebuild.Spec{Name: "crash", FromImage: e.ref, Steps: []imagebuild.Step{
			{Type: "RUN", Args: []string{"echo started; sleep 600"}},
		}}, func(l imagebuild.LogEntry) {
			if l.Message == "started" {
				once.Do(func() { close(started) })
			}
		})
		if cleanup != nil {
			cleanup()
		}
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("build ended before it could crash: %v", err)
	}
	if _, err := imagebuild.New(e.cfg); err != nil {
		t.Fatalf("New over a crashed build: %v", err)
	}
	if err := <-done; err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the build whose sandbox was removed: got %v, want it to fail at once", err)
	}
	e.noLeftovers()
	if n := len(e.layers()); n != 0 {
		t.Errorf("got %d layers, want 0", n)
	}
}

// With Config.Network, RUN steps run in the namespace it hands out (with
// the gateway as resolver, where the slot's DNS forwarder listens) and
// release it; without, they have no network.
func TestRunNetwork(t *testing.T) {
	e := newEnv(t, true)
	testenv.NeedCommand(t, "ip", "creates the test's network namespace (iproute2)")
	name := "agentenv-ibtest-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	var mu sync.Mutex
	held := 0
	cfg := e.cfg
	cfg.Network = func(ctx context.Context) (string, func(), error) {
		mu.Lock()
		held++
		mu.Unlock()
		return "/run/netns/" + name, func() { mu.Lock(); held--; mu.Unlock() }, nil
	}
	b, err := imagebuild.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	spec := imagebuild.Spec{Name: "net", FromImage: e.ref, Steps: []imagebuild.Step{
		{Type: "RUN", Args: []string{"cat /proc/net/dev > /netdev; cat /etc/resolv.conf > /resolv || true", "root"}},
	}}
	req, cleanup, err := b.Prepare(context.Background(), spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	if held != 0 {
		t.Errorf("%d network namespaces not released", held)
	}
	if !strings.Contains(readTree(t, req.Tree, "netdev"), "lo") {
		t.Errorf("no loopback in the build sandbox: %q", readTree(t, req.Tree, "netdev"))
	}
	if got, want := readTree(t, req.Tree, "resolv"), strings.TrimSpace(string(netns.ResolvConf())); got != want {
		t.Errorf("got resolv.conf %q in the build sandbox, want %q (its gateway)", got, want)
	}
	if _, err := os.Lstat(filepath.Join(req.Tree, "etc/resolv.conf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lent resolv.conf stayed in the tree: %v", err)
	}
	// Without a network (e.b): no resolv.conf is lent.
	spec.Steps[0].Args[0] += "; echo >> /resolv"
	req, _, err = e.prepare(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, req.Tree, "resolv"); got != "" {
		t.Errorf("without a network, the sandbox saw a resolv.conf: %q", got)
	}
}

// A busybox tree (no bash: the template's /bin/bash hands over to sh)
// runs the same steps.
func TestFromBusyboxTemplate(t *testing.T) {
	e := newEnv(t, false)
	if err := e.store.EnsureBusybox(context.Background()); err != nil {
		t.Fatal(err)
	}
	req, lines, err := e.prepare(context.Background(), imagebuild.Spec{Name: "bb", FromTemplate: "busybox", Steps: []imagebuild.Step{
		{Type: "USER", Args: []string{"worker"}},
		{Type: "WORKDIR", Args: []string{"/work"}},
		{Type: "RUN", Args: []string{"id -u > out; pwd >> out"}},
	}})
	if err != nil {
		t.Fatalf("Prepare: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if got := readTree(t, req.Tree, "work/out"); got != "1001\n/work" {
		t.Errorf("/work/out = %q, want the new user's uid and the workdir", got)
	}
}

// An import stands for its image reference only in its owner's builds and,
// when the operator's, in everyone's: another key's upload labelled with a
// reference must not become what a build FROM that reference runs. Layers
// are cached per owner.
func TestImportedImageAndCacheOwners(t *testing.T) {
	e := newEnv(t, false) // the registry is not reachable
	ctx := context.Background()
	ref := "registry.invalid/library/python:3.12"
	upload := func(name, owner string) {
		t.Helper()
		root := t.TempDir()
		testenv.GNURootfs(t, root)
		os.WriteFile(filepath.Join(root, "who"), []byte(name+"\n"), 0o644)
		var tarball bytes.Buffer
		if err := template.WriteTar(ctx, &tarball, root); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.Build(ctx, template.BuildRequest{Name: name, Owner: owner, Upload: &tarball, Image: ref}, func(template.Progress) {}); err != nil {
			t.Fatal(err)
		}
	}
	who := func(owner string) (string, error) {
		t.Helper()
		req, lines, err := e.prepare(ctx, imagebuild.Spec{Name: "app-" + owner, Owner: owner, FromImage: ref, Steps: []imagebuild.Step{
			{Type: "RUN", Args: []string{"cat /who > /seen", "root"}},
		}})
		if err != nil {
			return strings.Join(lines, "\n"), err
		}
		return readTree(t, req.Tree, "seen"), nil
	}
	upload("bobs-innocent", "bob")
	if got, err := who("alice"); err == nil {
		t.Errorf("alice's FROM %s used bob's upload labelled with it: /seen = %q", ref, got)
	}
	if got, err := who("bob"); err != nil || got != "bobs-innocent" {
		t.Errorf("bob's FROM his own import: /seen = %q, %v; want bobs-innocent", got, err)
	}
	upload("operator-py", "")
	for owner, want := range map[string]string{"alice": "operator-py", "": "operator-py", "bob": "bobs-innocent"} {
		if got, err := who(owner); err != nil || got != want {
			t.Errorf("%q's FROM %s: /seen = %q, %v; want %s", owner, ref, got, err, want)
		}
	}

	// The same step on the same (shared) base: cached for the key that ran
	// it, run again for another.
	stamp := func(owner string) (string, bool) {
		t.Helper()
		req, lines, err := e.prepare(ctx, imagebuild.Spec{Name: "stamp", Owner: owner, FromTemplate: "operator-py", Steps: []imagebuild.Step{
			{Type: "RUN", Args: []string{"cat /proc/sys/kernel/random/uuid > /by", "root"}},
		}})
		if err != nil {
			t.Fatalf("%s's build: %v\n%s", owner, err, strings.Join(lines, "\n"))
		}
		return readTree(t, req.Tree, "by"), strings.Contains(strings.Join(lines, "\n"), "CACHED [builder")
	}
	first, _ := stamp("alice")
	if got, cached := stamp("bob"); cached || got == first {
		t.Errorf("bob's build of the step alice ran: cached %v, /by %q (alice's %q); want his own run", cached, got, first)
	}
	if got, cached := stamp("alice"); !cached || got != first {
		t.Errorf("alice's second build: cached %v, /by %q; want her cached layer %q", cached, got, first)
	}
}
