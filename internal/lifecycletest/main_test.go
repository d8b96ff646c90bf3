package lifecycletest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// serveEnv makes the test binary an `agentenv serve` on the fake runtime
// (recover_test.go kills it with SIGKILL): its value is the data dir.
const serveEnv = "LIFECYCLETEST_SERVE"

// envdBin is the envd every fake sandbox runs: AGENTENV_TEST_ENVD (the
// Makefile builds it before dropping root), else built here.
var envdBin string

func TestMain(m *testing.M) {
	if dir := os.Getenv(serveEnv); dir != "" {
		os.Exit(serveMain(dir))
	}
	tmp, err := os.MkdirTemp("", "lifecycletest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	envdBin = os.Getenv("AGENTENV_TEST_ENVD")
	if envdBin == "" {
		envdBin = filepath.Join(tmp, "envd")
		cmd := exec.Command("go", "build", "-o", envdBin, "./cmd/envd")
		cmd.Dir = testenv.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build envd: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// serveMain runs the server of recover_test.go and prints its addresses.
func serveMain(dir string) int {
	cfg := Config(dir, os.Getenv("AGENTENV_TEST_ENVD"), os.Getenv("LIFECYCLETEST_CIDR"))
	logf, err := os.OpenFile(filepath.Join(dir, "server.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.Log = slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signalContext()
	defer stop()
	err = server.Run(ctx, cfg, func(apiAddr, proxyAddr string) {
		fmt.Printf("READY %s %s\n", apiAddr, proxyAddr)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-ch; cancel() }()
	return ctx, cancel
}

// cidrSeq keeps the loopback ranges of this process's hosts apart; the
// random base keeps them apart from another test process's.
var cidrSeq atomic.Int32

func newCIDR() string {
	n := int(cidrSeq.Add(1))
	return fmt.Sprintf("127.%d.%d.0/20", 64+rand.IntN(180), (n%16)*16)
}

// host is an in-process server stack on the fake runtime.
type host struct {
	t     *testing.T
	h     *server.Host
	m     *sandbox.Manager
	clock *Clock
	rt    runtime.Runtime
	dir   string
	cidr  string
}

type hostOpt func(*server.Config)

// newHost starts a host with a fake clock; Cleanup kills its sandboxes
// and checks that nothing of them is left.
func newHost(t *testing.T, opts ...hostOpt) *host {
	t.Helper()
	dir := t.TempDir()
	cfg := Config(dir, envdBin, newCIDR())
	clock := NewClock(time.Now())
	cfg.Clock = clock
	var rt runtime.Runtime
	cfg.NewRuntime = func(c server.Config, nets *netns.Manager) (runtime.Runtime, error) {
		r, err := NewRuntime(c, nets)
		rt = r
		return r, err
	}
	logw := &syncWriter{}
	// Debug: a failure shows each try of the wait for envd, and why it failed.
	cfg.Log = slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h, err := server.StartHost(ctx, cfg)
	if err != nil {
		t.Fatalf("start host: %v", err)
	}
	x := &host{t: t, h: h, m: h.Manager, clock: clock, rt: rt, dir: dir, cidr: cfg.NetworkCIDR}
	t.Cleanup(func() {
		if t.Failed() {
			// Before the kills: what the sandboxes said and which sockets
			// their addresses had when the test failed.
			x.logDiagnostics()
		}
		for _, sb := range x.m.List(sandbox.Filter{}) {
			x.m.Kill(context.Background(), sb.ID)
		}
		x.m.Shutdown()
		h.Close()
		x.noLeaks()
		if t.Failed() {
			t.Logf("server log (last %d lines):\n%s", logTail, tail(logw.String(), logTail))
		}
	})
	return x
}

// logTail is how much of a failed test's server log it prints.
const logTail = 400

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logDiagnostics logs each fake sandbox's output (envd's own log, e.g. a
// failed listen) and the TCP sockets at the host's addresses (a listener
// with a full accept queue drops SYNs: a dial times out on loopback).
func (x *host) logDiagnostics() {
	logs, _ := filepath.Glob(filepath.Join(x.dir, "sandboxes", "*", "init.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		x.t.Logf("%s:\n%s", l, tail(string(b), 40))
	}
	x.t.Logf("TCP sockets in %s:\n%s", x.cidr, strings.Join(tcpSockets(x.cidr), "\n"))
}

// tcpSockets lists the sockets of /proc/net/tcp whose local or remote
// address is in cidr: addresses, state, queues (for a listener rx is its
// accept queue), owner.
func tcpSockets(cidr string) []string {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return []string{err.Error()}
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return []string{err.Error()}
	}
	states := map[string]string{"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
		"06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}
	var out []string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		local, lok := procAddr(f[1])
		remote, rok := procAddr(f[2])
		if !(lok && pfx.Contains(local.Addr())) && !(rok && pfx.Contains(remote.Addr())) {
			continue
		}
		out = append(out, fmt.Sprintf("%s -> %s %s queues(tx:rx)=%s uid=%s", local, remote, states[f[3]], f[4], f[7]))
	}
	return out
}

// procAddr parses /proc/net/tcp's "0100007F:C35F" (the address in host
// byte order: little-endian here).
func procAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	ip, err1 := strconv.ParseUint(h, 16, 32)
	port, err2 := strconv.ParseUint(p, 16, 16)
	if !ok || err1 != nil || err2 != nil {
		return netip.AddrPort{}, false
	}
	a := netip.AddrFrom4([4]byte{byte(ip), byte(ip >> 8), byte(ip >> 16), byte(ip >> 24)})
	return netip.AddrPortFrom(a, uint16(port)), true
}

// noLeaks fails if the runtime still holds a sandbox or a sandbox's
// process still runs.
func (x *host) noLeaks() {
	x.t.Helper()
	ids, err := x.rt.List(context.Background())
	if err != nil || len(ids) > 0 {
		x.t.Errorf("runtime still holds %v (%v) after every sandbox was killed", ids, err)
	}
	if pids := envdProcs(x.dir); len(pids) > 0 {
		x.t.Errorf("envd processes of this host still run: %v", pids)
	}
}

// envdProcs lists the live (not zombie) processes whose working directory
// is under dir: the fake sandboxes of one host.
func envdProcs(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid := 0
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if s := string(b); strings.Contains(s[strings.LastIndexByte(s, ')'):], ") Z") {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

func (x *host) create(req sandbox.CreateRequest) sandbox.Sandbox {
	x.t.Helper()
	if req.Template == "" {
		req.Template = "busybox"
	}
	if req.Timeout == 0 {
		req.Timeout = 5 * time.Minute
	}
	sb, err := x.m.Create(context.Background(), req)
	if err != nil {
		x.t.Fatalf("create: %v", err)
	}
	return sb
}

// health asks a sandbox's envd directly.
func health(sb sandbox.Sandbox) error {
	c := &http.Client{Timeout: 15 * time.Second} // a safety net on a loaded host
	resp, err := c.Get("http://" + sb.Addr(envdapi.Port) + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// proxy serves the host's sandbox proxy.
func (x *host) proxy() *httptest.Server {
	srv := httptest.NewServer(proxy.New(x.m, slog.New(slog.NewTextHandler(io.Discard, nil))))
	x.t.Cleanup(srv.Close)
	return srv
}

// eventually polls cond until it holds or 30 s pass (a safety net on a
// loaded host).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// state is a sandbox's state, "gone" when the manager no longer has it.
func (x *host) state(id string) string {
	sb, err := x.m.Get(id)
	if err != nil {
		return "gone"
	}
	return string(sb.State)
}

// fakeState is what the runtime says of a sandbox.
func (x *host) fakeState(id string) runtime.Status {
	st, err := x.rt.State(context.Background(), id)
	if err != nil {
		x.t.Fatalf("runtime state: %v", err)
	}
	return st
}

// syncWriter is a log sink that goroutines share.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
