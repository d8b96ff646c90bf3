package metrics

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HTTPMiddleware records every request next serves in
// agentenv_http_requests_total{route,code} and
// agentenv_http_request_duration_seconds{route}. route names the request's
// route from a small fixed set (a pattern, never a raw path with IDs); it is
// called after next returns, so it can read r.Pattern set by a ServeMux that
// next wraps. A nil route uses r.Pattern. An empty route is recorded as
// "unmatched".
//
// The writer next sees passes Flush through at once (streams are not
// buffered) and unwraps for http.ResponseController. A nil Registry returns
// next itself.
func (r *Registry) HTTPMiddleware(next http.Handler, route func(*http.Request) string) http.Handler {
	if r == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, req)
		took := time.Since(start)

		name := req.Pattern
		if route != nil {
			name = route(req)
		}
		if name == "" {
			name = "unmatched"
		}
		code := sw.code
		if code == 0 {
			code = http.StatusOK // what net/http sends for a handler that wrote nothing
		}
		r.httpRequests.WithLabelValues(name, strconv.Itoa(code)).Inc()
		r.httpDuration.WithLabelValues(name).Observe(took.Seconds())
	})
}

// statusWriter remembers the status code of the response it writes.
type statusWriter struct {
	http.ResponseWriter
	code int // 0 until the final header is written
}

func (w *statusWriter) WriteHeader(code int) {
	// 1xx other than 101 are informational (103 Early Hints); the final
	// status follows.
	if w.code == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Flush sends what was written so far; the ResponseController finds a
// Flusher however deep the writers below are wrapped.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack takes over the connection (a proxied WebSocket upgrade), recorded
// as 101 when no status was written.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the writer below (deadlines,
// full duplex).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ProxyOp classifies a request the sandbox proxy forwards to a sandbox, for
// ObserveOp: the envd Connect-RPC /process.Process/Start is OpExec, the
// Connect filesystem service and envd's /files are OpFiles, and anything
// else (other envd calls, the sandbox's own servers) is OpPort. It looks at
// the path only: a proxy that knows the target port is not envd's may pass
// OpPort itself.
func ProxyOp(r *http.Request) string {
	p := r.URL.Path
	switch {
	case p == "/process.Process/Start":
		return OpExec
	case strings.HasPrefix(p, "/filesystem.Filesystem/"), p == "/files":
		return OpFiles
	}
	return OpPort
}
