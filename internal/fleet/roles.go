package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"agentenv/internal/api"
	"agentenv/internal/metrics"
	"agentenv/internal/server"
)

// Dial connects to etcd (comma-separated URLs).
func Dial(urls string) (*clientv3.Client, error) {
	var eps []string
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			eps = append(eps, u)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("--etcd: give the etcd cluster's client URLs, comma separated (e.g. http://10.0.0.1:2379,http://10.0.0.2:2379)")
	}
	return clientv3.New(clientv3.Config{
		Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
	})
}

// ReadSecret reads the cluster secret file.
func ReadSecret(path string) (string, error) {
	if path == "" {
		return "", errors.New("--cluster-secret-file is required: a file holding the secret that API servers and nodes share (e.g. `head -c 32 /dev/urandom | base64 > secret`)")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cluster secret: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if len(s) < 16 {
		return "", fmt.Errorf("cluster secret in %s is shorter than 16 characters: use a long random one", path)
	}
	return s, nil
}

// NodeRun is everything `agentenv node` is told.
type NodeRun struct {
	Host   server.Config // the sandbox stack, as `serve` takes it
	Node   NodeConfig
	Etcd   string
	Listen string
	// TLSCert and TLSKey make the node serve HTTPS; TLSCA verifies other
	// nodes (copies between nodes).
	TLSCert, TLSKey, TLSCA string
}

// LoadCA returns a TLS client configuration that trusts the CA in path
// (nil for an empty path: the system's roots).
func LoadCA(path string) (*tls.Config, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", path)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// RunNode runs a node agent until ctx ends.
func RunNode(ctx context.Context, cfg NodeRun) error {
	log := cfg.Host.Log
	if cfg.Node.Name == "" {
		return errors.New("--name is required: a name unique in the fleet (e.g. the host name)")
	}
	cli, err := Dial(cfg.Etcd)
	if err != nil {
		return err
	}
	defer cli.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	if cfg.Node.Advertise == "" {
		cfg.Node.Advertise = ln.Addr().String()
	}
	cfg.Node.Etcd, cfg.Node.Log = cli, log
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	cfg.Node.TLS = cfg.TLSCert != ""
	if cfg.Node.TLS {
		// A bad pair fails now, not after the node has registered.
		if _, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey); err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
	}
	if cfg.Node.PeerTLS, err = LoadCA(cfg.TLSCA); err != nil {
		return err
	}
	cfg.Node.MaxSandboxes = cfg.Host.Limits.MaxSandboxes
	reg := server.NewMetrics("node")
	cfg.Node.Metrics = reg
	node := NewNode(cfg.Node)
	cfg.Host.OnPersist = node.Changed
	host, err := server.StartHost(ctx, cfg.Host)
	if err != nil {
		return err
	}
	defer host.Close()
	node.attach(host)
	reg.SetSandboxStates(server.SandboxStates(host.Manager))
	reg.SetCapacity(func() metrics.Capacity {
		c := node.capacity()
		return metrics.Capacity{CPUs: c.CPUs, MemoryMB: c.MemoryMB, FreeMemoryMB: c.FreeMemoryMB, MaxSandboxes: c.MaxSandboxes,
			Sandboxes: c.Sandboxes, Templates: c.Templates, Snapshots: c.Snapshots}
	})
	srv := &http.Server{Handler: server.WithMetrics(reg, node.Handler()), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() {
		if cfg.Node.TLS {
			errc <- srv.ServeTLS(ln, cfg.TLSCert, cfg.TLSKey)
			return
		}
		errc <- srv.Serve(ln)
	}()
	log.Info("agentenv node serving", "tls", cfg.Node.TLS, "node", cfg.Node.Name, "listen", ln.Addr().String(), "advertise", cfg.Node.Advertise)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan struct{})
	go func() { node.Run(runCtx, host); close(runDone) }()
	select {
	case <-ctx.Done():
	case err = <-errc:
		// Nobody serves the port: leave the fleet rather than attract work.
		log.Error("node server stopped", "err", err)
	}
	stopRun()
	<-runDone
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	host.Manager.Shutdown()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// APIRun is everything `agentenv api` is told.
type APIRun struct {
	Etcd        string
	Listen      string
	ProxyListen string
	Secret      string
	APIKey      string
	Domain      string
	// TLSCA verifies nodes that serve TLS (empty: the system's roots).
	TLSCA string
	Log   *slog.Logger
	// Ready, if set, is called with the bound addresses.
	Ready func(apiAddr, proxyAddr string)
}

// RunAPI runs a stateless API server and sandbox proxy until ctx ends.
func RunAPI(ctx context.Context, cfg APIRun) error {
	log := cfg.Log
	if cfg.APIKey == "" {
		return errors.New("no API key: set AGENTENV_API_KEY (clients send it as X-API-Key, as E2B's SDKs do)")
	}
	cli, err := Dial(cfg.Etcd)
	if err != nil {
		return err
	}
	defer cli.Close()
	cache := NewCache(ctx, cli, log)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = cache.Wait(wctx)
	cancel()
	if err != nil {
		return err
	}
	tlsConf, err := LoadCA(cfg.TLSCA)
	if err != nil {
		return err
	}
	remote := NewRemote(cli, cache, cfg.Secret, tlsConf, log)
	reg := server.NewMetrics("api")
	remote.Observe = reg.ObserveOp
	reg.SetNodes(func() []metrics.NodeInfo {
		var out []metrics.NodeInfo
		for _, v := range remote.Nodes() {
			out = append(out, metrics.NodeInfo{Name: v.Name, Alive: v.Alive, Cordoned: v.Cordoned, Sandboxes: v.Sandboxes, FreeMemoryMB: v.Capacity.FreeMemoryMB})
		}
		return out
	})
	front, err := server.ListenFront(cfg.Listen, cfg.ProxyListen, cfg.Domain)
	if err != nil {
		return err
	}
	backend := api.Metered(remote, reg.ObserveOp)
	apiH := server.WithMetrics(reg, api.New(api.Config{APIKey: cfg.APIKey, Backend: backend, Fleet: remote, Domain: front.Domain, Log: log}).Handler())
	return front.Serve(ctx, log, "agentenv api", apiH, server.MeterProxy(reg, NewProxy(remote)), cfg.Ready)
}
