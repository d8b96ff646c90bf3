package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// env is one agentenv server shared by the tests of this package.
type env struct {
	cfg     server.Config
	api     string
	proxy   string
	key     string
	client  *client.Client
	cancel  context.CancelFunc
	done    chan error
	dataDir string
}

var (
	shared     *env
	sharedErr  error
	sharedOnce sync.Once
)

const (
	// testDomain is the servers' --domain: names under .localhost
	// resolve to loopback (nss-myhostname, installed by make setup).
	testDomain   = "agentenv.localhost"
	testKey      = "test-api-key"
	testSlotPool = 4
	// Named keys and the operator's (keys_test.go); testKey is the single
	// key, which sees every sandbox.
	aliceKey    = "alice-key-0123456789"
	bobKey      = "bob-key-0123456789ab"
	operatorKey = "operator-key-0123456789"
)

// startServer starts an in-process server on free ports with its own data
// dir, network range and network tag.
func startServer(t testing.TB, dataDir, cidr, tag string) *env {
	return startServerWith(t, dataDir, cidr, tag, nil)
}

// testDNS is the resolver of the tests' servers (DNSResolvers), standing
// in for the host's: it knows the names in testNames.
var testDNS = sync.OnceValues(func() (*testenv.DNS, error) { return testenv.StartDNS(testNames) })

// testNames are the names testDNS resolves: the fake internet's public
// address (network_test.go) and one nothing serves.
var testNames = map[string]string{"inet.agentenv.test": "198.51.100.7", "known.agentenv.test": "203.0.113.77"}

// startServerWith is startServer with changes to its configuration. The
// server's firewall table goes when the test ends.
func startServerWith(t testing.TB, dataDir, cidr, tag string, change func(*server.Config)) *env {
	t.Cleanup(func() {
		if err := testenv.DropFirewall(tag); err != nil {
			t.Log(err)
		}
	})
	return launchServer(t, dataDir, cidr, tag, change)
}

// launchServer starts a server that outlives t (the shared server).
func launchServer(t testing.TB, dataDir, cidr, tag string, change func(*server.Config)) *env {
	envdDir := filepath.Join(dataDir, "bin")
	os.MkdirAll(envdDir, 0o755)
	// Beside envd, where the server finds it for code interpreter builds.
	testenv.BuildCodeInterp(t, envdDir)
	dns, err := testDNS()
	if err != nil {
		t.Fatalf("the tests' DNS: %v", err)
	}
	cfg := server.Config{
		Listen: "127.0.0.1:0", ProxyListen: "127.0.0.1:0", DataDir: dataDir,
		Runsc: "runsc", Envd: testenv.BuildEnvd(t, envdDir), NetworkCIDR: cidr, NetworkTag: tag, DNSResolvers: []string{dns.Addr},
		Domain: testDomain, ProxyTLS: server.ProxyTLS{Listen: "127.0.0.1:0"},
		APIKey: testKey, APIKeys: map[string]string{aliceKey: "alice", bobKey: "bob"}, OperatorKey: operatorKey, Limits: testLimits(), SlotPool: testSlotPool, VolumeSizeMB: testVolumeMB, ReadyTemplates: true, WarmPool: 2, Runtime: os.Getenv("AGENTENV_TEST_RUNTIME"),
		Metrics: server.MetricsLabel{Key: "run"},
		Log:     slog.New(slog.NewTextHandler(logWriter(dataDir), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if change != nil {
		change(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{cfg: cfg, key: testKey, cancel: cancel, done: make(chan error, 1), dataDir: dataDir}
	ready := make(chan struct{})
	go func() {
		e.done <- server.Run(ctx, cfg, func(api, proxy string) {
			e.api, e.proxy = "http://"+api, "http://"+proxy
			close(ready)
		})
	}()
	select {
	case <-ready:
	case err := <-e.done:
		cancel()
		t.Fatalf("server did not start: %v", err)
	case <-time.After(2 * time.Minute):
		cancel()
		t.Fatal("server did not start within 2 minutes")
	}
	e.client = client.New(e.api, e.proxy, testKey)
	return e
}

// testVolumeMB is the size of the tests' volumes: small, so a test can
// fill one (serve's default is 10 GiB).
const testVolumeMB = 64

// testLimits are the defaults plus a hot pool of 2, so that the tests also
// exercise sandboxes handed out from it.
func testLimits() sandbox.Limits {
	l := sandbox.DefaultLimits()
	l.HotPool = 2
	return l
}

func logWriter(dir string) io.Writer {
	f, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return io.Discard
	}
	return f
}

// sharedServer returns the package's shared server, starting it on first use.
func sharedServer(t testing.TB) *env {
	t.Helper()
	testenv.NeedRunsc(t)
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "agentenv-test-")
		if err != nil {
			sharedErr = err
			return
		}
		shared = launchServer(t, dir, "10.120.0.0/20", "tst", nil)
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	if shared == nil {
		t.Fatal("shared server failed to start earlier")
	}
	return shared
}

func (e *env) stop() error {
	e.cancel()
	select {
	case err := <-e.done:
		return err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("server did not stop within 30s")
	}
}

func TestMain(m *testing.M) {
	// As in cmd/agentenv: this binary is also the gVisor runtime's worker.
	gvisorgo.WorkerMain()
	code := m.Run()
	stopSandboxFusion(code != 0)
	if shared != nil {
		ctx := context.Background()
		if sbs, err := shared.client.ListSandboxes(ctx, nil); err == nil {
			for _, sb := range sbs {
				shared.client.KillSandbox(ctx, sb.SandboxID)
			}
		}
		shared.stop()
		if err := testenv.DropFirewall("tst"); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		if code == 0 {
			os.RemoveAll(shared.dataDir)
		} else {
			fmt.Fprintf(os.Stderr, "server log kept in %s/server.log\n", shared.dataDir)
		}
	}
	os.Exit(code)
}

// create makes a sandbox and kills it when the test ends.
func (e *env) create(t testing.TB, req client.CreateRequest) client.Sandbox {
	t.Helper()
	if req.TemplateID == "" {
		req.TemplateID = "busybox"
	}
	sb, err := e.client.CreateSandbox(context.Background(), req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	t.Cleanup(func() { e.client.KillSandbox(context.Background(), sb.SandboxID) })
	return sb
}

// fork forks sb into n children through c, fails the test unless every
// child started, and kills them (through the server's key) when it ends.
func (e *env) fork(t testing.TB, c *client.Client, id string, n int) []client.Sandbox {
	t.Helper()
	kids, errs, err := c.ForkSandbox(context.Background(), id, n)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for i, k := range kids {
		if errs[i] != nil {
			t.Fatalf("fork child %d: %v", i, errs[i])
		}
		t.Cleanup(func() { e.client.KillSandbox(context.Background(), k.SandboxID) })
	}
	return kids
}

func (e *env) sh(t testing.TB, sb client.Sandbox, script string) client.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := e.client.Exec(ctx, sb, "/bin/sh", []string{"-c", script}, nil, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", script, err)
	}
	return res
}

// leftovers lists what of a sandbox is still on the host: runsc state,
// processes, cgroups, its directory, its network namespace. A kill answers
// before its teardown ends, so it waits up to 30 s for them to go (a
// safety net: a loaded host can stall a teardown for seconds).
func (e *env) leftovers(sb client.Sandbox, slotNS string) []string {
	deadline := time.Now().Add(30 * time.Second)
	for {
		left := e.leftoversNow(sb, slotNS)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) leftoversNow(sb client.Sandbox, slotNS string) []string {
	var out []string
	if b, err := exec.Command("runsc", "--root", filepath.Join(e.dataDir, "runsc"), "list", "--quiet").Output(); err == nil {
		if strings.Contains(string(b), sb.SandboxID) {
			out = append(out, "runsc container")
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), sb.SandboxID) {
			out = append(out, "process "+p)
		}
	}
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/agentenv/" + sb.SandboxID)
	cgs2, _ := filepath.Glob("/sys/fs/cgroup/*/*/*/agentenv/" + sb.SandboxID)
	for _, c := range append(cgs, cgs2...) {
		out = append(out, "cgroup "+c)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(b), sb.SandboxID) {
		out = append(out, "mount")
	}
	if _, err := os.Stat(filepath.Join(e.dataDir, "sandboxes", sb.SandboxID)); err == nil {
		out = append(out, "sandbox directory")
	}
	if slotNS != "" {
		if _, err := os.Stat("/run/agentenv/netns/" + slotNS); err == nil {
			out = append(out, "network namespace "+slotNS)
		}
	}
	return out
}

// namespaces lists the network namespaces with a server's tag.
func namespaces(tag string) []string {
	m, _ := filepath.Glob("/run/agentenv/netns/agentenv-" + tag + "-*")
	return m
}
