package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Front is the two public listeners of `serve` and of a fleet's API
// server: the REST API and the sandbox proxy.
type Front struct {
	api, proxy net.Listener
	// Domain is what <port>-<sandboxID>.<domain> host routing uses: the
	// configured one, else the proxy's address.
	Domain string
	// Limits bound what one client holds of either server (zero: the
	// defaults of HTTPLimits).
	Limits HTTPLimits
}

// ListenFront binds both listeners.
func ListenFront(apiAddr, proxyAddr, domain string) (*Front, error) {
	apiLn, err := net.Listen("tcp", apiAddr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", apiAddr, err)
	}
	proxyLn, err := net.Listen("tcp", proxyAddr)
	if err != nil {
		apiLn.Close()
		return nil, fmt.Errorf("listen %s: %w", proxyAddr, err)
	}
	if domain == "" {
		domain = proxyLn.Addr().String()
	}
	return &Front{api: apiLn, proxy: proxyLn, Domain: domain}, nil
}

// Serve serves the API and proxy handlers until ctx ends or one server
// fails, then shuts both down (10 s for requests in flight). ready, if not
// nil, is called with the bound addresses once both accept connections.
func (f *Front) Serve(ctx context.Context, log *slog.Logger, what string, apiH, proxyH http.Handler, ready func(apiAddr, proxyAddr string)) error {
	apiSrv, proxySrv := NewHTTPServer(apiH, f.Limits), NewHTTPServer(proxyH, f.Limits)
	errc := make(chan error, 2)
	go func() { errc <- apiSrv.Serve(LimitConnsPerIP(f.api, f.Limits, log)) }()
	go func() { errc <- proxySrv.Serve(LimitConnsPerIP(f.proxy, f.Limits, log)) }()
	log.Info(what+" serving", "api", f.api.Addr().String(), "proxy", f.proxy.Addr().String())
	if ready != nil {
		ready(f.api.Addr().String(), f.proxy.Addr().String())
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	apiSrv.Shutdown(sctx)
	proxySrv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
