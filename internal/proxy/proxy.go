// Package proxy routes HTTP traffic to ports inside sandboxes: by the
// E2b-Sandbox-Id / E2b-Sandbox-Port headers (what the E2B SDK sends when
// E2B_SANDBOX_URL is set) or by a Host of the form <port>-<sandboxID>.<domain>.
// It must not authenticate envd traffic to a running sandbox itself (envd
// checks its own token), but a request must carry that token, or a valid
// signature, before it wakes a paused one.
// It knows sandboxes only through Sandboxes, asked once per request: it
// must not know how they are stored, resumed or reached on the host.
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/envdapi"
	"github.com/agentenv/agentenv/internal/envdapi/envdauth"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
)

// Sandboxes is what the proxy needs of the sandboxes it routes to
// (sandbox.Manager).
type Sandboxes interface {
	// Resolve looks a sandbox up once and returns its route to port: the
	// address, boot, gone channel and traffic token of one boot. check,
	// if not nil, sees the route as found before anything is done to the
	// sandbox and its error is returned as is; only then may Resolve
	// resume a paused sandbox that resumes on traffic. An error otherwise
	// says why the sandbox cannot be reached, classed with errdefs.
	Resolve(sandboxID string, port int, check func(sandbox.Route) error) (sandbox.Route, error)
	// FindByToken returns a running or paused sandbox whose envd access
	// token match accepts: E2B's SDKs build signed downloadUrl/uploadUrl
	// on E2B_SANDBOX_URL without the sandbox, signing path, operation,
	// user and expiry with the sandbox's envd access token.
	FindByToken(match func(token string) bool) (sandboxID string, ok bool)
	// DialSandbox connects to a route's address. The host firewall
	// refuses connections to sandboxes without the server's socket mark,
	// which the sandboxes' owner sets (internal/dialer).
	DialSandbox(ctx context.Context, network, addr string) (net.Conn, error)
}

// EnvdPort is the port of the in-sandbox daemon, which checks its own
// access token and is exempt from traffic tokens.
const EnvdPort = envdapi.Port

// TrafficTokenHeader carries a sandbox's traffic token (as in E2B).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// Proxy is the sandbox traffic proxy.
type Proxy struct {
	boxes Sandboxes
	log   *slog.Logger
	rp    *httputil.ReverseProxy
}

// poolSuffix marks the pseudo host names the transport pools connections
// by: "<sandboxID>.sandbox:<port>". Pooling by sandbox, not by address,
// means a connection to a killed sandbox is never reused for a new sandbox
// that got the same address.
const poolSuffix = ".sandbox"

// New returns a proxy.
func New(boxes Sandboxes, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{boxes: boxes, log: log}
	transport := &http.Transport{
		// A new connection goes to the address the request resolved: the
		// pool key names the sandbox and its boot, and an address does not
		// change within a boot, so every request of that key has it.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			t, ok := ctx.Value(targetKey{}).(target)
			if !ok || addr != t.poolAddr() {
				return nil, fmt.Errorf("proxy: no route for connection to %s", addr)
			}
			return boxes.DialSandbox(ctx, network, t.route.Addr)
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.SetURL(&url.URL{Scheme: "http", Host: t.poolAddr()})
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:     transport,
		FlushInterval: -1, // stream every write (Connect server streams)
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t, _ := r.Context().Value(targetKey{}).(target)
			if errors.Is(context.Cause(r.Context()), errGone) {
				// The client is still there: tell it, rather than let an
				// empty 200 pass for an answer.
				WriteError(w, t.id, http.StatusBadGateway, "The sandbox stopped while the request was open", map[string]any{"port": t.port})
				return
			}
			if errors.Is(err, context.Canceled) {
				return
			}
			p.log.Warn("proxy: sandbox port not reachable", "sandbox", t.id, "port", t.port, "err", err)
			// E2B's answer when nothing listens on the port.
			WriteError(w, t.id, http.StatusBadGateway, "The sandbox is running but port is not open", map[string]any{"port": t.port})
		},
	}
	return p
}

type targetKey struct{}

// errGone ends a proxied request whose sandbox went away.
var errGone = errors.New("the sandbox went away")

// target is what one request resolved: its sandbox, port and route.
type target struct {
	id    string
	port  int
	route sandbox.Route
}

// poolAddr is the pseudo address connections to the target are pooled
// by: "<id>.<boot>.sandbox:<port>".
func (t target) poolAddr() string {
	host := t.id + "." + strconv.FormatUint(t.route.Boot, 10) + poolSuffix
	return net.JoinHostPort(host, strconv.Itoa(t.port))
}

// NotFound is E2B's message for a sandbox the proxy cannot route to
// (unknown, killed, paused and not resumed by traffic): the SDK reads the
// 502 that carries it as "not running".
const NotFound = "The sandbox was not found"

// WriteError answers with E2B's proxy error body: the sandbox ID, a
// message and the status as code (extra fields, such as the port, too).
func WriteError(w http.ResponseWriter, id string, status int, msg string, extra map[string]any) {
	body := map[string]any{"message": msg, "code": status}
	if id != "" {
		body["sandboxId"] = id
	}
	for k, v := range extra {
		body[k] = v
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// resolveError answers a request whose sandbox cannot be reached, as
// E2B's proxy does: 429 when resuming it hit a limit, 409 while it is
// changing state, else 502 "not found".
func resolveError(w http.ResponseWriter, id string, err error) {
	switch {
	case errors.Is(err, errdefs.ErrResourceExhausted):
		WriteError(w, id, http.StatusTooManyRequests, err.Error(), nil)
	case errors.Is(err, errdefs.ErrConflict):
		WriteError(w, id, http.StatusConflict, "The sandbox is still transitioning. Try again in a moment.", nil)
	default:
		WriteError(w, id, http.StatusBadGateway, NotFound, nil)
	}
}

// ParseHost splits "<port>-<sandboxID>.<domain>" (an optional ":port"
// after the domain is ignored) into its parts. The port must be a decimal
// number in 1..65535 without sign or leading zeros, and the ID a valid
// sandbox ID (ValidID).
func ParseHost(host string) (id string, port int, ok bool) {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && strings.Trim(host[i+1:], "0123456789") == "" {
		host = host[:i]
	}
	label, _, _ := strings.Cut(host, ".")
	ps, id, found := strings.Cut(label, "-")
	if !found || !ValidID(id) {
		return "", 0, false
	}
	port, err := ParsePort(ps)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// ParsePort reads a port number: decimal digits without sign or leading
// zeros, in 1..65535.
func ParsePort(s string) (int, error) {
	if s == "" || len(s) > 5 || s[0] == '0' || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("port %q is not a number in 1..65535", s)
	}
	port, _ := strconv.Atoi(s)
	if port > 65535 {
		return 0, fmt.Errorf("port %s out of range 1..65535", s)
	}
	return port, nil
}

// ValidID reports whether s can be a sandbox ID: 1 to 64 ASCII letters,
// digits, '-' or '_'. Anything else cannot name a sandbox, so it is
// refused before it reaches the resolver or a connection pool key.
func ValidID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Target returns the sandbox and port a request is for: from the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers when the ID header is set,
// else from the Host. The error says what is wrong with the request.
func Target(h http.Header, host string) (id string, port int, err error) {
	if id = h.Get("E2b-Sandbox-Id"); id != "" {
		if !ValidID(id) {
			return "", 0, fmt.Errorf("E2b-Sandbox-Id %q is not a sandbox ID", id)
		}
		port, err := ParsePort(h.Get("E2b-Sandbox-Port"))
		if err != nil {
			return "", 0, fmt.Errorf("E2b-Sandbox-Port: %w", err)
		}
		return id, port, nil
	}
	id, port, ok := ParseHost(host)
	if !ok {
		return "", 0, errors.New("cannot tell which sandbox this is for: send E2b-Sandbox-Id and E2b-Sandbox-Port headers, or use Host <port>-<sandboxID>.<domain> with a port in 1..65535 (E2B's signed file URLs carry their sandbox in the host when E2B_SANDBOX_URL is unset)")
	}
	return id, port, nil
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := Target(r.Header, r.Host)
	if err != nil {
		if !IsSignedFileURL(r) {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		var ok bool
		if id, ok = SignedBy(r, p.boxes); !ok {
			// envd's text for a signature that is not its own.
			writeError(w, http.StatusUnauthorized, "invalid signature")
			return
		}
		port = EnvdPort
	}
	// One look-up per request. The tokens are checked on the route as
	// found, before resolving may auto-resume a paused sandbox (the
	// request then waits for it): traffic without its token must not wake
	// it.
	route, err := p.boxes.Resolve(id, port, func(rt sandbox.Route) error { return checkAccess(r, port, rt) })
	if err != nil {
		var te tokenError
		if errors.As(err, &te) {
			WriteError(w, id, te.status, te.msg, nil)
			return
		}
		p.log.Debug("proxy: sandbox not routable", "sandbox", id, "port", port, "err", err)
		resolveError(w, id, err)
		return
	}
	r.Header.Del("E2b-Sandbox-Id")
	r.Header.Del("E2b-Sandbox-Port")
	r.Header.Del(TrafficTokenHeader)
	// End the request when the sandbox goes away: its TCP peer vanishes
	// without a reset, so the connection would otherwise hang. Gone is
	// the channel of the boot the request is pooled under.
	ctx, cancel := context.WithCancelCause(context.WithValue(r.Context(), targetKey{}, target{id: id, port: port, route: route}))
	defer cancel(nil)
	go func() {
		select {
		case <-route.Gone:
			cancel(errGone)
		case <-ctx.Done():
		}
	}()
	// Without full duplex, net/http closes the request body once response
	// headers are out, and the transport's last read of it then aborts a
	// streaming response half-way (golang/go#40747).
	http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// tokenError refuses a request without the token its sandbox needs.
type tokenError struct {
	status int
	msg    string
}

func (e tokenError) Error() string { return e.msg }

// checkAccess refuses a request the route's sandbox would refuse, before
// anything is done to the sandbox: one to an exposed port without the
// sandbox's traffic token (403), and one to envd of a sandbox that traffic
// would resume without envd's access token or a valid signature (401,
// envd's answer). A running envd checks its own token, so a request that
// wakes nothing is left to it (its /health is open).
func checkAccess(r *http.Request, port int, rt sandbox.Route) error {
	if port == EnvdPort {
		if !rt.Wakes {
			return nil
		}
		if msg := envdauth.Refusal(r, rt.EnvdToken); msg != "" {
			return tokenError{http.StatusUnauthorized, msg}
		}
		return nil
	}
	if rt.Token == "" {
		return nil
	}
	got, hdr := r.Header.Get(TrafficTokenHeader), strings.ToLower(TrafficTokenHeader)
	switch {
	case got == "":
		return tokenError{http.StatusForbidden, fmt.Sprintf("Sandbox is secured with traffic access token. Token header '%s' is missing", hdr)}
	case subtle.ConstantTimeCompare([]byte(got), []byte(rt.Token)) != 1:
		return tokenError{http.StatusForbidden, fmt.Sprintf("Sandbox is secured with traffic access token. Provided token in header '%s' is invalid", hdr)}
	}
	return nil
}

// IsSignedFileURL reports whether r is envd's /files with a signature:
// a URL E2B's downloadUrl/uploadUrl made.
func IsSignedFileURL(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Get("signature") != ""
}

// SignedBy finds the sandbox whose envd token made the signature of a
// signed /files URL. The sandbox's envd checks the signature again, and
// its expiry.
func SignedBy(r *http.Request, boxes Sandboxes) (string, bool) {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	path, user, exp, sig := q.Get("path"), q.Get("username"), q.Get("signature_expiration"), []byte(q.Get("signature"))
	return boxes.FindByToken(func(token string) bool {
		return subtle.ConstantTimeCompare([]byte(envdauth.FileSignature(path, op, user, token, exp)), sig) == 1
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}
