// Package fleet runs agentenv on many hosts with etcd as the source of
// truth: it wires the two roles, `agentenv node` (package node: runs
// sandboxes and publishes what it holds) and `agentenv api` (package
// router: stateless API servers that place sandboxes and route every call
// and every byte of sandbox traffic to the owning node), over the etcd
// state of package store. It must not hold sandbox logic of its own:
// nodes run the same sandbox manager as `agentenv serve`, behind the
// service.Backend seam.
package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/fleet/node"
	"github.com/agentenv/agentenv/internal/fleet/router"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/service"
)

// EtcdAuth is how a fleet role authenticates to etcd: etcd is trusted
// only when it knows who is calling (client certificates, or an etcd
// user), since whoever writes there steers the fleet.
type EtcdAuth struct {
	// CA verifies etcd's server certificate (https:// endpoints); Cert
	// and Key are this role's client certificate.
	CA, Cert, Key string
	// User and Password log in as an etcd user (with etcd auth enabled).
	User, Password string
}

func (a EtcdAuth) authenticated() bool { return a.Cert != "" || a.User != "" }

// Dial connects to etcd (comma-separated URLs). Endpoints off loopback
// must be https:// and the connection authenticated: a fleet whose etcd
// anyone on the network can read or write is anyone's fleet.
func Dial(urls string, auth EtcdAuth) (*clientv3.Client, error) {
	var eps []string
	secure := true
	for _, u := range strings.Split(urls, ",") {
		if u = strings.TrimSpace(u); u == "" {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return nil, fmt.Errorf("--etcd %q: give URLs such as https://10.0.0.1:2379", u)
		}
		if pu.Scheme == "http" && !IsLoopback(pu.Hostname()) {
			return nil, fmt.Errorf("--etcd %s: etcd off this host must be reached over https:// with client certificates "+
				"(--etcd-ca, --etcd-cert, --etcd-key; `agentenv etcd --tls-cert ... --tls-key ... --tls-ca ...` serves so): "+
				"whoever reaches a plain etcd owns every sandbox of the fleet", u)
		}
		secure = secure && IsLoopback(pu.Hostname())
		eps = append(eps, u)
	}
	if len(eps) == 0 {
		return nil, errors.New("--etcd: give the etcd cluster's client URLs, comma separated (e.g. https://10.0.0.1:2379,https://10.0.0.2:2379)")
	}
	if !secure && !auth.authenticated() {
		return nil, errors.New("--etcd: etcd off this host needs authentication: give this role a client certificate (--etcd-cert, --etcd-key, with --etcd-ca) or an etcd user (--etcd-user and AGENTENV_ETCD_PASSWORD)")
	}
	if (auth.Cert == "") != (auth.Key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	cfg := clientv3.Config{
		Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
		Username: auth.User, Password: auth.Password,
	}
	if auth.CA != "" || auth.Cert != "" {
		info := transport.TLSInfo{CertFile: auth.Cert, KeyFile: auth.Key, TrustedCAFile: auth.CA}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS (--etcd-ca/--etcd-cert/--etcd-key): %w", err)
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// IsLoopback reports whether host names this host's loopback.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// etcdAddrs returns the addresses of etcd's endpoints, which no sandbox
// may reach whatever its egress policy allows.
func etcdAddrs(urls string) []netip.Prefix {
	var out []netip.Prefix
	for _, u := range strings.Split(urls, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Hostname() == "" {
			continue
		}
		ips, err := net.LookupIP(pu.Hostname())
		if err != nil {
			continue
		}
		for _, ip := range ips {
			if a, ok := netip.AddrFromSlice(ip.To4()); ok {
				out = append(out, netip.PrefixFrom(a, 32))
			}
		}
	}
	return out
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
	Host     server.Config // the sandbox stack, as `serve` takes it
	Node     node.Config
	Etcd     string
	EtcdAuth EtcdAuth
	Listen   string
	// TLSCert and TLSKey make the node serve HTTPS and are its client
	// certificate towards other nodes; TLSCA is the fleet's CA: it
	// verifies other nodes, and callers must then present a certificate
	// it signed (mutual TLS), and no node is reached over plain HTTP.
	TLSCert, TLSKey, TLSCA string
}

// LoadCA returns a TLS client configuration that trusts the CA in path
// (nil for an empty path: the system's roots).
func LoadCA(path string) (*tls.Config, error) {
	if path == "" {
		return nil, nil
	}
	pool, err := readPool(path)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// peerTLS is the TLS configuration of a role calling nodes: the fleet's
// CA, and the role's own certificate for nodes that require one. Without
// a CA it is nil (plain HTTP allowed: a fleet on one host's loopback).
func peerTLS(ca, cert, key string) (*tls.Config, error) {
	if (cert == "") != (key == "") {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	tc, err := LoadCA(ca)
	if err != nil || tc == nil {
		if err == nil && cert != "" {
			err = errors.New("--tls-cert needs --tls-ca: the CA of the fleet's certificates (nodes verify callers with it)")
		}
		return nil, err
	}
	if cert == "" {
		return nil, errors.New("--tls-ca turns on mutual TLS between the fleet's roles: give this role its certificate too (--tls-cert, --tls-key, signed by that CA for both server and client use)")
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	tc.Certificates = []tls.Certificate{pair}
	return tc, nil
}

// RunNode runs a node agent until ctx ends.
func RunNode(ctx context.Context, cfg NodeRun) error {
	log := cfg.Host.Log
	if cfg.Node.Name == "" {
		return errors.New("--name is required: a name unique in the fleet (e.g. the host name)")
	}
	cli, err := Dial(cfg.Etcd, cfg.EtcdAuth)
	if err != nil {
		return err
	}
	defer cli.Close()
	if cfg.Node.PeerTLS, err = peerTLS(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	if cfg.Node.Advertise == "" {
		cfg.Node.Advertise = ln.Addr().String()
	}
	cfg.Node.Etcd, cfg.Node.Log = cli, log
	cfg.Node.TLS = cfg.TLSCert != ""
	var serverTLS *tls.Config
	if cfg.Node.TLS {
		// A bad pair fails now, not after the node has registered.
		pair, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		serverTLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
		if cfg.Node.PeerTLS != nil {
			// Callers must show a certificate of the fleet's CA; /health
			// stays open to probes without one (Handler checks).
			serverTLS.ClientCAs, serverTLS.ClientAuth = cfg.Node.PeerTLS.RootCAs, tls.VerifyClientCertIfGiven
			cfg.Node.RequireClientCert = true
		}
	}
	// Sandboxes never reach etcd, whatever their egress policy says.
	cfg.Host.Unreachable = append(cfg.Host.Unreachable, etcdAddrs(cfg.Etcd)...)
	cfg.Node.MaxSandboxes = cfg.Host.Limits.MaxSandboxes
	reg := server.NewMetrics("node")
	if err := cfg.Host.Metrics.Apply(reg); err != nil {
		return err
	}
	cfg.Node.Metrics = reg
	nd := node.New(cfg.Node)
	if err := nd.Check(ctx); err != nil {
		return err
	}
	cfg.Host.OnPersist = nd.Changed
	host, err := server.StartHost(ctx, cfg.Host)
	if err != nil {
		return err
	}
	defer host.Close()
	nd.Attach(host.Backend)
	server.WatchHost(reg, host)
	reg.SetCapacity(func() metrics.Capacity {
		c := nd.Capacity()
		return metrics.Capacity{CPUs: c.CPUs, MemoryMB: c.MemoryMB, FreeMemoryMB: c.FreeMemoryMB, MaxSandboxes: c.MaxSandboxes,
			Sandboxes: c.Sandboxes, Templates: c.Templates, Snapshots: c.Snapshots}
	})
	srv, ln := server.NewHTTPServer(server.WithMetrics(reg, nd.Handler()), cfg.Host.HTTP), server.LimitConnsPerIP(ln, cfg.Host.HTTP, log)
	errc := make(chan error, 1)
	go func() {
		if serverTLS != nil {
			srv.TLSConfig = serverTLS
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	log.Info("agentenv node serving", "tls", cfg.Node.TLS, "node", cfg.Node.Name, "listen", ln.Addr().String(), "advertise", cfg.Node.Advertise)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan struct{})
	var runErr error
	go func() { runErr = nd.Run(runCtx, host.Backend); close(runDone) }()
	select {
	case <-ctx.Done():
	case err = <-errc:
		// Nobody serves the port: leave the fleet rather than attract work.
		log.Error("node server stopped", "err", err)
	case <-runDone:
		err = runErr // its name is another live node's
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
	Etcd string
	// SandboxFusion, when its Listen is set, serves SandboxFusion's
	// run_code API over the fleet's sandboxes.
	SandboxFusion sandboxfusion.Config
	Listen        string
	ProxyListen   string
	Secret        string
	APIKey        string
	// APIKeys maps named keys to their names: each sees only its own
	// sandboxes and snapshots.
	APIKeys map[string]string
	Domain  string
	// ProxyTLS is the proxy's HTTPS listener for *.Domain (its Domain is
	// Domain): an operator's certificate, or a local CA in its CADir,
	// which every API server behind one name must share.
	ProxyTLS server.ProxyTLS
	// OperatorKey, if set, is the key of node operations (cordon, drain,
	// forget); API keys cannot do them.
	OperatorKey string
	EtcdAuth    EtcdAuth
	// TLSCA is the fleet's CA: nodes are then reached over mutual TLS
	// only, with TLSCert/TLSKey as this API server's certificate.
	TLSCA, TLSCert, TLSKey string
	Log                    *slog.Logger
	// Metrics labels the counts of command results with the value of one
	// metadata key of the sandboxes (nodes count their ends).
	Metrics server.MetricsLabel
	// Ready, if set, is called with the bound addresses.
	Ready func(apiAddr, proxyAddr string)
}

// RunAPI runs a stateless API server and sandbox proxy until ctx ends.
func RunAPI(ctx context.Context, cfg APIRun) error {
	log := cfg.Log
	acfg := api.Config{APIKey: cfg.APIKey, APIKeys: cfg.APIKeys, OperatorKey: cfg.OperatorKey, Log: log}
	if err := api.CheckKeys(acfg); err != nil {
		return fmt.Errorf("%w (clients send it as X-API-Key, as E2B's SDKs do)", err)
	}
	tlsConf, err := peerTLS(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return err
	}
	cli, err := Dial(cfg.Etcd, cfg.EtcdAuth)
	if err != nil {
		return err
	}
	defer cli.Close()
	cache := store.NewCache(ctx, cli, secret.NewSealer(cfg.Secret), log)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = cache.Wait(wctx)
	cancel()
	if err != nil {
		return err
	}
	remote := router.NewRemote(cli, cache, cfg.Secret, tlsConf, log)
	reg := server.NewMetrics("api")
	if err := cfg.Metrics.Apply(reg); err != nil {
		return err
	}
	reg.SetMetadata(func(id string) map[string]string {
		if rec, ok := cache.Sandbox(id); ok {
			return rec.Sandbox.Metadata
		}
		return nil
	})
	remote.Observe = reg.ObserveOp
	reg.SetNodes(func() []metrics.NodeInfo {
		var out []metrics.NodeInfo
		for _, v := range remote.Nodes() {
			out = append(out, metrics.NodeInfo{Name: v.Name, Alive: v.Alive, Cordoned: v.Cordoned, Sandboxes: v.Sandboxes, FreeMemoryMB: v.Capacity.FreeMemoryMB})
		}
		return out
	})
	ptls := cfg.ProxyTLS
	ptls.Domain = cfg.Domain
	front, err := server.ListenFront(cfg.Listen, cfg.ProxyListen, ptls)
	if err != nil {
		return err
	}
	// The fleet's sandboxes as etcd lists them (each node reports its pools).
	reg.SetSandboxes(func() []metrics.SandboxCount { return server.CountSandboxes(cache.LiveMatching(sandbox.Filter{})) })
	backend := service.Metered(remote, reg)
	go reg.RunHistory(ctx, server.LiveInterval, server.LiveKeep)
	acfg.Backend, acfg.Fleet, acfg.Domain, acfg.Metrics = backend, remote, front.Domain, reg
	a := api.New(acfg)
	apiH := server.WithKeyedMetrics(reg, a.Handler(), a.Scrape(reg.Handler()))
	stopSF := func() {}
	if cfg.SandboxFusion.Listen != "" {
		if stopSF, err = server.ServeSandboxFusion(ctx, cfg.SandboxFusion, backend, front.Addrs().Proxy, server.HTTPLimits{}, log); err != nil {
			return err
		}
	}
	defer stopSF()
	return front.Serve(ctx, log, "agentenv api", apiH, proxy.Metered(reg, router.NewProxy(remote)), cfg.Ready)
}
