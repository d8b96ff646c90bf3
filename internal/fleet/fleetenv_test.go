package fleet_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/runtime/gvisorgo"
	"github.com/agentenv/agentenv/internal/testenv"
)

// The fleet test's environment, for real: a 3-member etcd cluster
// (agentenv etcd: etcd's own Go module), 3 node agents and 2 API servers,
// all separate processes, each node in a network and mount namespace of
// its own behind a bridge the test made, so that taking a node's link
// down cuts it off. Only addresses inside those namespaces and loopback
// are used.

const (
	bridge   = "aeflbr0"
	bridgeIP = "10.231.0.1"
	apiKey   = "fleet-test-key"
	opKey    = "fleet-test-operator-key"
	aliceKey = "fleet-test-alice-key"
	bobKey   = "fleet-test-bob-key-00"
)

type fleetEnv struct {
	t *testing.T
	// nodeHTTP trusts the test CA that signed the nodes' certificate
	// (and shows none of its own); certHTTP also shows the test's
	// client certificate.
	nodeHTTP, certHTTP *http.Client
	// etcdTLS is a client configuration for etcd with the test's
	// certificate (an insider who reached etcd, without the secret).
	etcdTLS *tls.Config
	dir     string
	bin     string
	secret  string
	etcd    []*proc
	etcdURL string
	nodes   []*proc
	apis    []*proc
	clients []*client.Client
	// ops hold the operator's key (node operations).
	ops     []*client.Client
	apiURLs [][2]string
	// apiTLS are the API servers' HTTPS proxy addresses (--domain
	// fleetDomain, a local CA in dir/proxy-ca shared by both).
	apiTLS []string
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func quiet(args ...string) { exec.Command(args[0], args[1:]...).Run() }

// leaseTTL is the nodes' --lease-ttl: short, for the tests that wait for a
// node to be lost, but not so short that a loaded host's stall (a node or
// etcd unscheduled, a slow fsync behind etcd's renewals) loses a live node
// (it was 3 s).
const leaseTTL = 6 * time.Second

func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// netSetup makes the bridge and one namespace per node, linked to it.
func (f *fleetEnv) netSetup(n int) {
	t := f.t
	f.netTeardown(n)
	sh(t, "ip", "link", "add", bridge, "type", "bridge")
	sh(t, "ip", "addr", "add", bridgeIP+"/24", "dev", bridge)
	sh(t, "ip", "link", "set", bridge, "up")
	for i := 1; i <= n; i++ {
		ns, host, peer := fmt.Sprintf("aefl-n%d", i), fmt.Sprintf("aeflh%d", i), fmt.Sprintf("aeflp%d", i)
		sh(t, "ip", "netns", "add", ns)
		sh(t, "ip", "link", "add", host, "type", "veth", "peer", "name", peer)
		sh(t, "ip", "link", "set", peer, "netns", ns)
		sh(t, "ip", "link", "set", host, "master", bridge)
		sh(t, "ip", "link", "set", host, "up")
		sh(t, "ip", "-n", ns, "addr", "add", fmt.Sprintf("10.231.0.%d/24", 10+i), "dev", peer)
		sh(t, "ip", "-n", ns, "link", "set", peer, "up")
		sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	t.Cleanup(func() { f.netTeardown(n) })
}

func (f *fleetEnv) netTeardown(n int) {
	for i := 1; i <= n; i++ {
		quiet("ip", "link", "del", fmt.Sprintf("aeflh%d", i))
		quiet("ip", "netns", "del", fmt.Sprintf("aefl-n%d", i))
	}
	quiet("ip", "link", "del", bridge)
}

// reapSandboxes removes whatever sandboxes the test's nodes left: node
// agents leave their sandboxes running when they stop (the next start
// adopts them), and a test's nodes never start again. The sandboxes are
// found by their directories in the nodes' data dirs and by their runsc
// processes (all nodes run them under one root path, nodeData's), and
// removed through the runtime's own cgroup teardown (kills what is in
// them, removes the directories). Registered before the nodes start, it
// runs after their cleanups stopped them, however the test ended; after a
// passing run, finding anything is a leak and fails the test.
func (f *fleetEnv) reapSandboxes() {
	ids := map[string]bool{}
	running := 0
	dirs, _ := filepath.Glob(filepath.Join(f.dir, "n*", "sandboxes", "i*"))
	for _, d := range dirs {
		ids[filepath.Base(d)] = true
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 1 && slices.Contains(args, "--root="+nodeData+"/runsc") {
			ids[args[len(args)-1]] = true
			running++
		}
	}
	for id := range ids {
		if err := gvisorgo.RemoveCgroups("agentenv", id); err != nil {
			f.t.Errorf("removing what sandbox %s left: %v", id, err)
		}
	}
	// Every subtest ends by killing what it made: after a passing run
	// nothing may be left.
	if len(ids) > 0 && !f.t.Failed() {
		f.t.Errorf("the nodes left %d sandboxes (%d runsc processes still running) after every one was killed", len(ids), running)
	}
}

// startEtcd starts a 3-member cluster (agentenv etcd: etcd's Go module)
// as three processes whose client URLs are on the bridge.
func (f *fleetEnv) startEtcd() {
	t := f.t
	var peers, clients []string
	for range 3 {
		peers = append(peers, fmt.Sprintf("https://127.0.0.1:%d", freePort(t, "127.0.0.1")))
		clients = append(clients, fmt.Sprintf("https://%s:%d", bridgeIP, freePort(t, bridgeIP)))
	}
	var members []string
	for i, p := range peers {
		members = append(members, fmt.Sprintf("m%d=%s", i, p))
	}
	f.etcdURL = strings.Join(clients, ",")
	for i := range 3 {
		f.etcd = append(f.etcd, f.start(fmt.Sprintf("etcd-m%d", i), f.bin, "etcd", "--name", fmt.Sprintf("m%d", i),
			"--data-dir", filepath.Join(f.dir, "etcd", fmt.Sprintf("m%d", i)), "--listen", clients[i],
			"--listen-peer", peers[i], "--initial-cluster", strings.Join(members, ","),
			"--tls-cert", filepath.Join(f.dir, "node.crt"), "--tls-key", filepath.Join(f.dir, "node.key"), "--tls-ca", filepath.Join(f.dir, "ca.crt")))
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: clients, DialTimeout: 2 * time.Second, Logger: zap.NewNop(), TLS: f.etcdTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	eventually(t, 60*time.Second, "etcd cluster serving", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := cli.Put(ctx, "/agentenv-test/ready", "1")
		return err
	})
}

func (f *fleetEnv) start(name string, args ...string) *proc {
	p := &proc{name: name, log: filepath.Join(f.dir, name+".log"), done: make(chan struct{})}
	lf, err := os.Create(p.log)
	if err != nil {
		f.t.Fatal(err)
	}
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = lf, lf
	p.cmd.Env = append(os.Environ(), "AGENTENV_API_KEY="+apiKey)
	if err := p.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() { p.cmd.Wait(); lf.Close(); close(p.done) }()
	f.t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	return p
}

func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// nodeData is where every node sees its own data dir (a bind mount in a
// mount namespace of its own), as every node of a real fleet uses the
// same --data-dir: snapshots name their template image by path.
const nodeData = "/run/agentenv-fleet-test/data"

func (f *fleetEnv) startNode(i int) *proc {
	name := fmt.Sprintf("n%d", i)
	real := filepath.Join(f.dir, name)
	if err := os.MkdirAll(real, 0o700); err != nil {
		f.t.Fatal(err)
	}
	args := []string{f.bin, "node",
		"--name", name, "--etcd", f.etcdURL, "--listen", fmt.Sprintf("10.231.0.%d:3100", 10+i),
		"--data-dir", nodeData, "--cluster-secret-file", filepath.Join(f.dir, "secret"),
		"--network-cidr", fmt.Sprintf("10.232.%d.0/20", 16*(i-1)), "--network-tag", "f" + string(rune('a'+i-1)),
		"--lease-ttl", leaseTTL.String(), "--warm-pool", "1", "--slot-pool", "2", "--max-sandboxes", "100", "--disk-budget", "1T", "--metrics-label-key", "run",
		"--tls-cert", filepath.Join(f.dir, "node.crt"), "--tls-key", filepath.Join(f.dir, "node.key"), "--tls-ca", filepath.Join(f.dir, "ca.crt")}
	args = append(args, f.etcdFlags()...)
	script := fmt.Sprintf("mount --bind %q %q && exec \"$@\"", real, nodeData)
	return f.start("node-"+name, append([]string{"nsenter", "--net=/run/netns/aefl-" + name,
		"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}, args...)...)
}

func (f *fleetEnv) startAPI(i int) {
	// Port 0, read back from its log: it binds after reaching etcd, and a
	// port found free before could be taken meanwhile.
	args := []string{f.bin, "api", "--etcd", f.etcdURL,
		"--listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
		"--domain", fleetDomain, "--proxy-tls-listen", "127.0.0.1:0", "--ca-dir", filepath.Join(f.dir, "proxy-ca"),
		"--cluster-secret-file", filepath.Join(f.dir, "secret"), "--operator-key-file", filepath.Join(f.dir, "operator-key"),
		"--api-keys-file", filepath.Join(f.dir, "api-keys"), "--metrics-label-key", "run",
		"--tls-ca", filepath.Join(f.dir, "ca.crt"), "--tls-cert", filepath.Join(f.dir, "node.crt"), "--tls-key", filepath.Join(f.dir, "node.key")}
	p := f.start(fmt.Sprintf("api%d", i), append(args, f.etcdFlags()...)...)
	f.apis = append(f.apis, p)
	addrs := testenv.ServingAddrs(f.t, p.log, 0, "agentenv api", 90*time.Second)
	a, x := "http://"+addrs.API, "http://"+addrs.Proxy
	f.apiURLs = append(f.apiURLs, [2]string{a, x})
	f.apiTLS = append(f.apiTLS, addrs.ProxyTLS)
	f.clients = append(f.clients, client.New(a, x, apiKey))
	f.ops = append(f.ops, client.New(a, x, opKey))
}

// fleetDomain is the API servers' --domain.
const fleetDomain = "fleet.localhost"

// etcdFlags are a role's flags for the test's etcd: TLS with the test's
// client certificate.
func (f *fleetEnv) etcdFlags() []string {
	return []string{"--etcd-ca", filepath.Join(f.dir, "ca.crt"), "--etcd-cert", filepath.Join(f.dir, "node.crt"), "--etcd-key", filepath.Join(f.dir, "node.key")}
}

// logs prints every process's log tail when the test failed.
func (f *fleetEnv) logs() {
	if !f.t.Failed() {
		return
	}
	for _, p := range append(append(f.nodes, f.apis...), f.etcd...) {
		b, _ := os.ReadFile(p.log)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		f.t.Logf("---- %s ----\n%s", p.name, b)
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %v", what, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func nodeCounts(ctx context.Context, c *client.Client) (map[string]client.Node, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]client.Node{}
	for _, n := range nodes {
		out[n.Name] = n
	}
	return out, nil
}

func (f *fleetEnv) waitAlive(c *client.Client, names ...string) {
	eventually(f.t, 90*time.Second, "nodes alive "+strings.Join(names, ","), func() error {
		m, err := nodeCounts(context.Background(), c)
		if err != nil {
			return err
		}
		for _, n := range names {
			if !m[n].Alive || m[n].Capacity.Templates == 0 {
				return fmt.Errorf("node %s not alive with its templates: %+v", n, m[n])
			}
		}
		return nil
	})
}

// waitLost waits until the API server reports the node lost.
func (f *fleetEnv) waitLost(c *client.Client, name string) {
	eventually(f.t, 30*time.Second, name+" lost", func() error {
		m, err := nodeCounts(context.Background(), c)
		if err == nil && m[name].Alive {
			err = fmt.Errorf("%s still alive", name)
		}
		return err
	})
}

func execOut(ctx context.Context, c *client.Client, sb client.Sandbox, script string) (string, error) {
	var out bytes.Buffer
	res, err := c.Exec(ctx, sb, "/bin/sh", []string{"-c", script}, &out, &out)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return out.String(), fmt.Errorf("exit %d: %s", res.ExitCode, out.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// writeTLS writes a test CA (ca.crt) and a certificate for the fleet's
// addresses signed by it (node.crt, node.key: server and client use, as
// every role of the test shows it) into dir, and returns a client that
// trusts the CA, one that also shows the certificate, and an etcd
// client configuration with it.
func writeTLS(t *testing.T, dir string) (plain, withCert *http.Client, etcd *tls.Config) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentenv fleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "agentenv node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("10.231.0.11"), net.ParseIP("10.231.0.12"), net.ParseIP("10.231.0.13"),
			net.ParseIP(bridgeIP), net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	for name, block := range map[string]*pem.Block{
		"ca.crt":   {Type: "CERTIFICATE", Bytes: caDER},
		"node.crt": {Type: "CERTIFICATE", Bytes: der},
		"node.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	pair, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	certConf := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}},
		&http.Client{Transport: &http.Transport{TLSClientConfig: certConf}}, certConf.Clone()
}

// holdInMemory starts a process in sb that keeps a random value only in
// a shell variable (rewriting /tmp/w from it) and returns the value.
func holdInMemory(t *testing.T, c *client.Client, sb client.Sandbox) string {
	t.Helper()
	ctx := context.Background()
	if _, err := execOut(ctx, c, sb, `v=$(cat /proc/sys/kernel/random/uuid); echo $v > /tmp/v; (while :; do echo $v > /tmp/w.new && mv /tmp/w.new /tmp/w; sleep 0.1; done) >/dev/null 2>&1 </dev/null & sleep 0.3`); err != nil {
		t.Fatal(err)
	}
	want, err := execOut(ctx, c, sb, "cat /tmp/v; rm /tmp/v")
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// checkMemory checks that sb's process still holds want in memory: it
// writes /tmp/w again after the file is removed. The process writes by
// rename, so a read never sees a half-written file, and it gets up to 10 s
// to write (a restored child on a busy host can be slow to run again).
func checkMemory(t *testing.T, c *client.Client, sb client.Sandbox, want string) {
	t.Helper()
	got, err := execOut(context.Background(), c, sb, "rm -f /tmp/w; i=0; while [ ! -e /tmp/w ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/w; test ! -e /tmp/v && echo no-v")
	if err != nil {
		t.Fatal(err)
	}
	if got != want+"\nno-v" {
		t.Fatalf("sandbox %s: the process's memory holds %q, want %q", sb.SandboxID, got, want+"\nno-v")
	}
}
