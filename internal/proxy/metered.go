package proxy

import (
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/metrics"
)

// Metered records the latency of commands (and file calls) proxied to
// envd, and counts them in flight: what an exec costs as the client sees
// it. It counts each command's result (ok, nonzero, timeout, oom) from the
// end of its stream, read as it passes.
func Metered(reg *metrics.Registry, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := metrics.ProxyOp(r)
		if op == metrics.OpPort {
			h.ServeHTTP(w, r)
			return
		}
		// Deferred: the reverse proxy panics with http.ErrAbortHandler
		// when the client leaves mid-stream, as the SDKs do once a
		// command's end event arrives (before the stream's trailer).
		done := reg.Begin(op)
		defer done(nil)
		if op != metrics.OpExec {
			h.ServeHTTP(w, r)
			return
		}
		ew := &execWriter{ResponseWriter: w}
		start := time.Now()
		id, _, _ := Target(r.Header, r.Host)
		defer func() {
			if res := ew.result(r, time.Since(start)); res != "" {
				reg.ObserveExec(res, id)
			}
		}()
		h.ServeHTTP(ew, r)
	})
}
