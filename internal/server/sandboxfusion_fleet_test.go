package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/fleet/fleettest"
	"github.com/agentenv/agentenv/internal/fleet/node"
	"github.com/agentenv/agentenv/internal/fleetroles"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// sfFleetRunner is the fleet test's runner template: Debian with python3
// alone, which builds faster than the default one.
const sfFleetRunner = "sfpy"

// role is a fleet role running in this process until its cancel.
type role struct {
	cancel context.CancelFunc
	done   chan error
}

func (r role) stop(t *testing.T, name string) {
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s stopped: %v", name, err)
		}
	case <-time.After(time.Minute):
		t.Errorf("%s did not stop within a minute", name)
	}
}

// startAPIRole runs `agentenv api` in-process and waits until it serves.
func startAPIRole(t *testing.T, run fleetroles.APIRun) (role, *client.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := role{cancel: cancel, done: make(chan error, 1)}
	ready := make(chan [2]string, 1)
	run.Ready = func(api, proxy string) { ready <- [2]string{api, proxy} }
	go func() { r.done <- fleetroles.RunAPI(ctx, run) }()
	select {
	case a := <-ready:
		return r, client.New("http://"+a[0], "http://"+a[1], run.APIKey)
	case err := <-r.done:
		cancel()
		t.Fatalf("api role did not start: %v", err)
	case <-time.After(2 * time.Minute):
		cancel()
		t.Fatal("api role did not start within 2 minutes")
	}
	return role{}, nil
}

// TestSandboxFusionInFleet serves SandboxFusion from the API role of a
// fleet (`agentenv api --sandboxfusion-listen`): verl's payload reaches
// /run_code on the API server, whose calls run in sandboxes on a node,
// reached through the API server's own proxy. One node, two API servers
// (one builds the runner template, the other serves SandboxFusion: API
// servers are stateless), an in-process etcd.
func TestSandboxFusionInFleet(t *testing.T) {
	testenv.NeedRunsc(t)
	const tag = "sff"
	t.Cleanup(func() {
		if err := testenv.DropFirewall(tag); err != nil {
			t.Error(err)
		}
	})
	dir := t.TempDir()
	etcd := fleettest.EtcdLoopback(t)
	logf, err := os.Create(filepath.Join(dir, "fleet.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("fleet log tail:\n%s", b)
		}
	})
	dns, err := testDNS()
	if err != nil {
		t.Fatal(err)
	}
	const secret = "sf-fleet-test-secret-0123456789"
	envdDir := filepath.Join(dir, "bin")
	os.MkdirAll(envdDir, 0o755)

	nctx, ncancel := context.WithCancel(context.Background())
	nodeRole := role{cancel: ncancel, done: make(chan error, 1)}
	go func() {
		nodeRole.done <- fleetroles.RunNode(nctx, fleetroles.NodeRun{
			Host: server.Config{DataDir: filepath.Join(dir, "node"), Runsc: "runsc", Envd: testenv.BuildEnvd(t, envdDir),
				NetworkCIDR: "10.137.0.0/20", NetworkTag: tag, DNSResolvers: []string{dns.Addr}, Limits: sandbox.DefaultLimits(),
				ReadyTemplates: true, Runtime: os.Getenv("AGENTENV_TEST_RUNTIME"), Log: log.With("role", "node")},
			Node:   node.Config{Name: "sfn1", Secret: secret, LeaseTTL: 10 * time.Second},
			Etcd:   etcd,
			Listen: "127.0.0.1:0",
		})
	}()
	defer nodeRole.stop(t, "node")

	run := fleetroles.APIRun{Etcd: etcd, Listen: "127.0.0.1:0", ProxyListen: "127.0.0.1:0", Secret: secret, APIKey: testKey, Log: log.With("role", "api1")}
	api1, c := startAPIRole(t, run)
	defer api1.stop(t, "api1")
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for {
		nodes, err := c.Nodes(ctx)
		if err == nil && len(nodes) == 1 && nodes[0].Alive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not join within a minute: %v %v", nodes, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer func() {
		// What the calls left (their kills run after the answer).
		if sbs, err := c.ListSandboxes(ctx, nil); err == nil {
			for _, sb := range sbs {
				c.KillSandbox(ctx, sb.SandboxID)
			}
		}
	}()
	start := time.Now()
	if _, err := c.BuildTemplate(ctx, client.BuildRequest{Name: sfFleetRunner, Debian: "bookworm", Packages: []string{"python3"}}, func(client.BuildProgress) {}); err != nil {
		t.Fatalf("build the runner template on the node: %v", err)
	}
	t.Logf("runner template %s built on the node in %s", sfFleetRunner, time.Since(start).Round(time.Second))

	sfAddr := make(chan string, 1)
	run.Log = log.With("role", "api2")
	run.SandboxFusion = sandboxfusion.Config{Listen: "127.0.0.1:0", Template: sfFleetRunner, Pool: 1, Ready: func(a string) { sfAddr <- a }}
	api2, _ := startAPIRole(t, run)
	defer api2.stop(t, "api2")
	sf := sfClient{url: "http://" + <-sfAddr}

	stdin := "41\n"
	code := "import socket\nprint(int(input()) + 1, socket.gethostname() != '')"
	var resp sandboxfusion.RunCodeResponse
	deadline = time.Now().Add(2 * time.Minute)
	for {
		resp = sf.verl(t, "python", code, &stdin, 10, 1024)
		if resp.Status == sandboxfusion.Success || !strings.Contains(resp.Message, "being checked") || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if resp.Status != sandboxfusion.Success || resp.RunResult == nil || str(resp.RunResult.Stdout) != "42 True\n" {
		t.Fatalf("verl's payload through the API role: got %s, want Success with stdout \"42 True\\n\"", show(resp))
	}
	resp = sf.verl(t, "python", "import sys\nsys.exit(3)", nil, 10, 1024)
	if resp.Status != sandboxfusion.Failed || resp.RunResult == nil || resp.RunResult.ReturnCode == nil || *resp.RunResult.ReturnCode != 3 {
		t.Errorf("a program exiting 3: got %s, want Failed with return_code 3", show(resp))
	}
	var ping string
	if r, err := http.Get(sf.url + "/v1/ping"); err != nil {
		t.Errorf("GET /v1/ping: %v", err)
	} else {
		json.NewDecoder(r.Body).Decode(&ping)
		r.Body.Close()
		if ping != "pong" {
			t.Errorf("GET /v1/ping: got %q, want \"pong\"", ping)
		}
	}
}
