// Package fleetroles wires the fleet's two roles: `agentenv node` (this
// host's sandbox stack, as `serve` runs it, behind the node service of
// package node) and `agentenv api` (the REST API and sandbox proxy over
// package router's Remote backend). It must not hold sandbox logic of its
// own: nodes run the same sandbox manager as `agentenv serve`, behind the
// service.Backend seam.
package fleetroles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/fleet"
	"github.com/agentenv/agentenv/internal/fleet/node"
	"github.com/agentenv/agentenv/internal/fleet/router"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/metrics"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/sandboxfusion"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/service"
)

// NodeRun is everything `agentenv node` is told.
type NodeRun struct {
	Host     server.Config // the sandbox stack, as `serve` takes it
	Node     node.Config
	Etcd     string
	EtcdAuth fleet.EtcdAuth
	Listen   string
	// TLSCert and TLSKey make the node serve HTTPS and are its client
	// certificate towards other nodes; TLSCA is the fleet's CA: it
	// verifies other nodes, and callers must then present a certificate
	// it signed (mutual TLS), and no node is reached over plain HTTP.
	TLSCert, TLSKey, TLSCA string
}

// RunNode runs a node agent until ctx ends.
func RunNode(ctx context.Context, cfg NodeRun) error {
	log := cfg.Host.Log
	if cfg.Node.Name == "" {
		return errors.New("--name is required: a name unique in the fleet (e.g. the host name)")
	}
	cli, err := fleet.Dial(cfg.Etcd, cfg.EtcdAuth)
	if err != nil {
		return err
	}
	defer cli.Close()
	if cfg.Node.PeerTLS, err = fleet.PeerTLS(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey); err != nil {
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
	cfg.Host.Unreachable = append(cfg.Host.Unreachable, fleet.EtcdAddrs(cfg.Etcd)...)
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
	EtcdAuth    fleet.EtcdAuth
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
	tlsConf, err := fleet.PeerTLS(cfg.TLSCA, cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return err
	}
	cli, err := fleet.Dial(cfg.Etcd, cfg.EtcdAuth)
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
