package router

import (
	"context"
	"errors"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/proxy"
)

// Proxy is an API server's sandbox proxy: it finds the node that owns the
// sandbox a request is for (E2b-Sandbox-Id/-Port headers or a Host of
// <port>-<id>.<domain>) and forwards the request there, streaming both
// ways. The node's own proxy does the rest (traffic tokens, envd).
type Proxy struct {
	remote *Remote
	rp     *httputil.ReverseProxy
}

// NewProxy returns the proxy of an API server.
func NewProxy(r *Remote) *Proxy {
	p := &Proxy{remote: r}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) {},
		Transport:     r.http.Transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			id := r.Header.Get("E2b-Sandbox-Id")
			if errors.Is(context.Cause(r.Context()), errNodeLost) {
				writeProxyError(w, id, http.StatusBadGateway, "the sandbox's node was lost during the request (its lease expired)")
				return
			}
			if r.Context().Err() != nil {
				return // the client went away
			}
			writeProxyError(w, id, http.StatusBadGateway, "the sandbox's node did not answer: "+err.Error())
		},
	}
	return p
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := proxy.Target(r.Header, r.Host)
	if err != nil {
		writeProxyError(w, "", http.StatusBadRequest, err.Error())
		return
	}
	_, c, err := p.remote.locate(r.Context(), id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			// E2B's answer, which the SDK reads as "not running".
			writeProxyError(w, id, http.StatusBadGateway, proxy.NotFound)
			return
		}
		writeProxyError(w, id, http.StatusServiceUnavailable, err.Error())
		return
	}
	// The node routes by these headers whatever the client used; the
	// Host header travels unchanged.
	r.Header.Set("E2b-Sandbox-Id", id)
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	if c.err != nil {
		writeProxyError(w, id, http.StatusBadGateway, c.err.Error())
		return
	}
	u, _ := url.Parse(c.base)
	r.URL.Scheme, r.URL.Host = u.Scheme, u.Host
	if err := c.auth.Sign(r); err != nil {
		writeProxyError(w, id, http.StatusBadGateway, err.Error())
		return
	}
	serveUntilLost(w, r, c.gone(), p.rp)
}

// serveUntilLost serves r through h, full duplex (an upload streams
// through while the answer may start: docs/traps.md), and ends it when
// gone closes: a request to a node that is lost ends then, not when a
// dead link times out.
func serveUntilLost(w http.ResponseWriter, r *http.Request, gone <-chan struct{}, h http.Handler) {
	http.NewResponseController(w).EnableFullDuplex()
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	go func() {
		select {
		case <-gone:
			cancel(errNodeLost)
		case <-ctx.Done():
		}
	}()
	h.ServeHTTP(w, r.WithContext(ctx))
}

// errNodeLost is why a proxied request ended when its node was lost.
var errNodeLost = errors.New("node lost")

// writeProxyError answers with the body of E2B's proxy (sandboxId,
// message, code): the SDK reads 502 as "the sandbox is not running".
func writeProxyError(w http.ResponseWriter, id string, status int, msg string) {
	proxy.WriteError(w, id, status, msg, nil)
}
