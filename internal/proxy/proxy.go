// Package proxy routes HTTP traffic to ports inside sandboxes: by the
// E2b-Sandbox-Id / E2b-Sandbox-Port headers (what the E2B SDK sends when
// E2B_SANDBOX_URL is set) or by a Host of the form <port>-<sandboxID>.<domain>.
// It must not authenticate envd traffic itself: envd checks its own token.
package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/binary"
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

	"agentenv/internal/errdefs"
)

// Resolver finds the host-reachable address of a running sandbox's port.
type Resolver interface {
	// Addr returns host:port for the sandbox's port and a channel closed
	// when the sandbox goes away, or an error that says why the sandbox
	// cannot be reached.
	Addr(sandboxID string, port int) (addr string, gone <-chan struct{}, err error)
}

// SandboxDialer is implemented by resolvers whose sandboxes accept only
// connections the resolver opens (the host firewall refuses connections to
// sandboxes without the server's socket mark). Without it, the proxy dials
// addresses itself.
type SandboxDialer interface {
	// DialSandbox connects to an address Addr returned.
	DialSandbox(ctx context.Context, network, addr string) (net.Conn, error)
}

// TrafficTokens is implemented by resolvers whose sandboxes may require a
// token on requests to their exposed ports.
type TrafficTokens interface {
	// TrafficToken returns the token a sandbox requires, or "".
	TrafficToken(sandboxID string) string
}

// EnvdPort is the port of the in-sandbox daemon, which checks its own
// access token and is exempt from traffic tokens.
const EnvdPort = 49983

// TrafficTokenHeader carries a sandbox's traffic token (as in E2B).
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// Proxy is the sandbox traffic proxy.
type Proxy struct {
	resolve Resolver
	log     *slog.Logger
	rp      *httputil.ReverseProxy
}

// poolSuffix marks the pseudo host names the transport pools connections
// by: "<sandboxID>.sandbox:<port>". Pooling by sandbox, not by address,
// means a connection to a killed sandbox is never reused for a new sandbox
// that got the same address.
const poolSuffix = ".sandbox"

// New returns a proxy.
func New(r Resolver, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{resolve: r, log: log}
	dial := (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if d, ok := r.(SandboxDialer); ok {
		dial = d.DialSandbox
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, portStr, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.Atoi(portStr)
			if err != nil {
				return nil, err
			}
			target, _, err := r.Addr(strings.TrimSuffix(host, poolSuffix), port)
			if err != nil {
				return nil, err
			}
			return dial(ctx, network, target)
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.SetURL(&url.URL{Scheme: "http", Host: net.JoinHostPort(t.id+poolSuffix, strconv.Itoa(t.port))})
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		Transport:     transport,
		FlushInterval: -1, // stream every write (Connect server streams)
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			t, _ := r.Context().Value(targetKey{}).(target)
			p.log.Warn("proxy: sandbox port not reachable", "sandbox", t.id, "port", t.port, "err", err)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox port is not reachable: %v", err))
		},
	}
	return p
}

type targetKey struct{}

type target struct {
	id   string
	port int
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
		return "", 0, errors.New("cannot tell which sandbox this is for: send E2b-Sandbox-Id and E2b-Sandbox-Port headers, or use Host <port>-<sandboxID>.<domain> with a port in 1..65535")
	}
	return id, port, nil
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := Target(r.Header, r.Host)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	_, gone, err := p.resolve.Addr(id, port)
	if err != nil {
		// 502 tells the E2B SDK the sandbox is not running; a paused one
		// gets 409 and a message saying to resume it.
		status := http.StatusBadGateway
		if errors.Is(err, errdefs.ErrConflict) {
			status = http.StatusConflict
			if writeConnectError(w, r, "failed_precondition", err.Error()) {
				return
			}
		}
		writeError(w, status, err.Error())
		return
	}
	if tt, ok := p.resolve.(TrafficTokens); ok && port != EnvdPort {
		if want := tt.TrafficToken(id); want != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get(TrafficTokenHeader)), []byte(want)) != 1 {
			writeError(w, http.StatusForbidden, fmt.Sprintf("sandbox %s accepts traffic to its ports only with its traffic token in the %s header (trafficAccessToken from the create response)", id, TrafficTokenHeader))
			return
		}
	}
	r.Header.Del("E2b-Sandbox-Id")
	r.Header.Del("E2b-Sandbox-Port")
	r.Header.Del(TrafficTokenHeader)
	// End the request when the sandbox goes away: its TCP peer vanishes
	// without a reset, so the connection would otherwise hang.
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), targetKey{}, target{id: id, port: port}))
	defer cancel()
	go func() {
		select {
		case <-gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	// Without full duplex, net/http closes the request body once response
	// headers are out, and the transport's last read of it then aborts a
	// streaming response half-way (golang/go#40747).
	http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// writeConnectError answers a Connect streaming request with a Connect
// error (HTTP 200 and an end-of-stream message), because Connect clients
// drop the body of a non-200 stream response and the user would never see
// why. It reports whether the request was a Connect stream.
func writeConnectError(w http.ResponseWriter, r *http.Request, code, msg string) bool {
	ct := r.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "application/connect+") {
		return false
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	frame := make([]byte, 5, 5+len(body))
	frame[0] = 0x02 // end of stream
	binary.BigEndian.PutUint32(frame[1:], uint32(len(body)))
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	w.Write(append(frame, body...))
	return true
}
