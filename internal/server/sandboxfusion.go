package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/agentenv/agentenv/internal/sandboxfusion"
)

// ServeSandboxFusion serves the SandboxFusion-compatible API
// (internal/sandboxfusion) on cfg.Listen over backend, reaching envd
// through the sandbox proxy at proxyAddr, until ctx ends; stop waits for
// it to close. The service builds its runner template when missing and
// keeps its pool filled in the background.
func ServeSandboxFusion(ctx context.Context, cfg sandboxfusion.Config, backend sandboxfusion.Sandboxes, proxyAddr string, limits HTTPLimits, log *slog.Logger) (stop func(), err error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s (--sandboxfusion-listen): %w", cfg.Listen, err)
	}
	sctx, cancel := context.WithCancel(ctx)
	svc := sandboxfusion.New(sctx, cfg, backend, "http://"+proxyAddr, log)
	srv := NewHTTPServer(svc.Handler(), limits)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(LimitConnsPerIP(ln, limits, log))
	}()
	// Closed when ctx ends, as the API and the proxy are: a call taken
	// after the proxy has gone would fail.
	go func() {
		<-sctx.Done()
		shctx, c := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer c()
		srv.Shutdown(shctx)
	}()
	auth := "none (loopback)"
	if cfg.Key != "" {
		auth = "key required: header X-API-Key, or the URL http://HOST:PORT/KEY/run_code"
	}
	log.Info("sandboxfusion serving", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/run_code", "auth", auth, "template", svc.Template(), "languages", sandboxfusion.Languages())
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	return func() {
		cancel()
		<-done
		svc.Wait()
	}, nil
}
