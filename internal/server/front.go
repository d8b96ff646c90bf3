package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/localca"
)

// Front is the public listeners of `serve` and of a fleet's API server:
// the REST API, the sandbox proxy and, with a domain, the proxy's HTTPS
// listener for <port>-<sandboxID>.<domain>.
type Front struct {
	api, proxy, proxyTLS net.Listener
	tlsConf              *tls.Config
	// Domain is what the create answer tells clients to put after
	// "<port>-<sandboxID>.": the configured domain with the HTTPS port
	// (unless 443), else the plain proxy's address.
	Domain string
	// CAFile is the local CA's certificate clients trust ("" without
	// one).
	CAFile string
	// Limits bound what one client holds of either server (zero: the
	// defaults of HTTPLimits).
	Limits HTTPLimits
}

// ProxyTLS configures the proxy's HTTPS listener for *.Domain.
type ProxyTLS struct {
	// Domain, if set, turns HTTPS on: sandboxes' ports are then
	// https://<port>-<sandboxID>.<Domain>[:port].
	Domain string
	// Listen is the HTTPS listener's address.
	Listen string
	// CertFile and KeyFile are the operator's certificate of *.Domain;
	// without them a local CA in CADir issues one.
	CertFile, KeyFile string
	// CADir holds the local CA (ca.pem, ca-key.pem), made there once.
	CADir string
	// Log is told when an old local CA is replaced (nil: slog's default).
	Log *slog.Logger
}

// certSource returns where the HTTPS listener's certificate comes from.
func (t ProxyTLS) certSource() (src *localca.Source, caFile string, err error) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, "", errors.New("give both --proxy-tls-cert and --proxy-tls-key, or neither (a local CA then issues the certificate)")
	}
	if t.CertFile != "" {
		src, err = localca.FromFiles(t.CertFile, t.KeyFile, t.Domain)
		return src, "", err
	}
	if t.CADir == "" {
		return nil, "", fmt.Errorf("--domain %s needs a certificate for *.%s: give --proxy-tls-cert and --proxy-tls-key, or --ca-dir for a local CA", t.Domain, t.Domain)
	}
	ca, err := localca.LoadOrCreate(t.CADir, t.Domain, t.Log)
	if err != nil {
		return nil, "", err
	}
	src, err = localca.FromCA(ca, t.Domain, nil)
	return src, ca.Path, err
}

// Check reports what is wrong with the configuration before anything
// starts: the domain, the certificate files, the local CA (made if
// absent).
func (t ProxyTLS) Check() error {
	_, _, err := t.load()
	return err
}

// load returns the HTTPS listener's TLS configuration and the local CA's
// certificate file; nil without a domain.
func (t ProxyTLS) load() (*tls.Config, string, error) {
	if t.Domain == "" {
		if t.CertFile != "" || t.KeyFile != "" {
			return nil, "", errors.New("--proxy-tls-cert/--proxy-tls-key need --domain: the certificate is for *.<domain>")
		}
		return nil, "", nil
	}
	if err := localca.CheckDomain(t.Domain); err != nil {
		return nil, "", fmt.Errorf("--domain: %w", err)
	}
	src, caFile, err := t.certSource()
	if err != nil {
		return nil, "", err
	}
	return src.TLSConfig(), caFile, nil
}

// ListenFront binds the listeners.
func ListenFront(apiAddr, proxyAddr string, t ProxyTLS) (_ *Front, err error) {
	f := &Front{}
	if f.tlsConf, f.CAFile, err = t.load(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.api, err = net.Listen("tcp", apiAddr); err != nil {
		return nil, fmt.Errorf("listen %s: %w", apiAddr, err)
	}
	if f.proxy, err = net.Listen("tcp", proxyAddr); err != nil {
		return nil, fmt.Errorf("listen %s: %w", proxyAddr, err)
	}
	f.Domain = f.proxy.Addr().String()
	if f.tlsConf != nil {
		if f.proxyTLS, err = net.Listen("tcp", t.Listen); err != nil {
			return nil, fmt.Errorf("listen %s (--proxy-tls-listen): %w", t.Listen, err)
		}
		f.Domain = localca.HostPort(t.Domain, f.proxyTLS.Addr().String())
	}
	return f, nil
}

func (f *Front) close() {
	for _, l := range []net.Listener{f.api, f.proxy, f.proxyTLS} {
		if l != nil {
			l.Close()
		}
	}
}

// Addrs are the bound addresses of a Front.
type Addrs struct {
	API, Proxy string
	// ProxyTLS is the HTTPS proxy's address, "" without a domain.
	ProxyTLS string
}

// Addrs returns the bound addresses.
func (f *Front) Addrs() Addrs {
	a := Addrs{API: f.api.Addr().String(), Proxy: f.proxy.Addr().String()}
	if f.proxyTLS != nil {
		a.ProxyTLS = f.proxyTLS.Addr().String()
	}
	return a
}

// Serve serves the API and proxy handlers until ctx ends or one server
// fails, then shuts them down (10 s for requests in flight). ready, if not
// nil, is called with the API's and the plain proxy's addresses once all
// accept connections (Addrs has the HTTPS one).
func (f *Front) Serve(ctx context.Context, log *slog.Logger, what string, apiH, proxyH http.Handler, ready func(apiAddr, proxyAddr string)) error {
	apiSrv, proxySrv := NewHTTPServer(apiH, f.Limits), NewHTTPServer(proxyH, f.Limits)
	servers := []*http.Server{apiSrv, proxySrv}
	errc := make(chan error, 3)
	go func() { errc <- apiSrv.Serve(LimitConnsPerIP(f.api, f.Limits, log)) }()
	go func() { errc <- proxySrv.Serve(LimitConnsPerIP(f.proxy, f.Limits, log)) }()
	if f.proxyTLS != nil {
		tlsSrv := NewHTTPServer(proxyH, f.Limits)
		tlsSrv.TLSConfig = f.tlsConf
		servers = append(servers, tlsSrv)
		// The per-source cap counts TCP connections, before any handshake.
		ln := tls.NewListener(LimitConnsPerIP(f.proxyTLS, f.Limits, log), f.tlsConf)
		go func() { errc <- tlsSrv.Serve(ln) }()
	}
	a := f.Addrs()
	// Its api= and proxy= are how a parent that started `agentenv serve`
	// on port 0 learns the ports (internal/bench, testenv.ServeAddrs).
	log.Info(what+" serving", "api", a.API, "proxy", a.Proxy, "proxyTLS", a.ProxyTLS, "domain", f.Domain, "ca", f.CAFile)
	if ready != nil {
		ready(a.API, a.Proxy)
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(sctx)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
