package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/client/api/envd/processpb"
	"github.com/agentenv/agentenv/client/api/envd/processpb/processpbconnect"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/proxy"
	"github.com/agentenv/agentenv/internal/sandbox"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		host   string
		id     string
		port   int
		wantOK bool
	}{
		{"49983-iabc123.example.com", "iabc123", 49983, true},
		{"49983-iabc123.example.com:443", "iabc123", 49983, true},
		{"8080-iabc123.localhost:3001", "iabc123", 8080, true},
		{"3000-iabc123", "iabc123", 3000, true},
		{"8080-id-with-dash.example.com", "id-with-dash", 8080, true},
		{"iabc123.example.com", "", 0, false},
		{"example.com", "", 0, false},
		{"localhost:8080", "", 0, false},
		{"", "", 0, false},
		{"http-iabc123.example.com", "", 0, false},
		{"49983-.example.com", "", 0, false},
		{"-iabc123.example.com", "", 0, false},
		{"example.com.49983-iabc123", "", 0, false}, // only the first label counts
		{"0-iabc123.example.com", "", 0, false},
		{"65535-iabc123.example.com", "iabc123", 65535, true},
		{"65536-iabc123.example.com", "", 0, false},
		{"99999999999999999999-iabc123.example.com", "", 0, false},
		{"+80-iabc123.example.com", "", 0, false},
		{"080-iabc123.example.com", "", 0, false},
		{"80-i/../x.example.com", "", 0, false},
		{"80-a:b.example.com", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			id, port, ok := proxy.ParseHost(tt.host)
			if id != tt.id || port != tt.port || ok != tt.wantOK {
				t.Errorf("ParseHost(%q) = %q, %d, %v; want %q, %d, %v", tt.host, id, port, ok, tt.id, tt.port, tt.wantOK)
			}
		})
	}
}

// fakeResolver is a proxy.Sandboxes over a fixed table of sandboxes.
type fakeResolver struct {
	mu    sync.Mutex
	boxes map[string]fakeBox
	// boot is the boot of every sandbox (a test boots them again).
	boot atomic.Uint64
	// woken counts the resumes traffic made.
	woken atomic.Int64
}

type fakeBox struct {
	addr string // backend host:port
	gone chan struct{}
	// token is the traffic token ("" public).
	token string
	// asleep: paused, and traffic resumes it (once check passes);
	// envdToken is envd's access token.
	asleep    bool
	envdToken string
}

func (f *fakeResolver) Resolve(id string, port int, check func(sandbox.Route) error) (sandbox.Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id == "paused" {
		return sandbox.Route{}, fmt.Errorf("sandbox %q is paused: %w", id, errdefs.ErrNotFound)
	}
	if id == "busy" {
		return sandbox.Route{}, errdefs.Conflict("sandbox %q is being resumed", id)
	}
	if id == "full" {
		return sandbox.Route{}, fmt.Errorf("limit of sandboxes reached: %w", errdefs.ErrResourceExhausted)
	}
	b, ok := f.boxes[id]
	if !ok {
		return sandbox.Route{}, fmt.Errorf("sandbox %q not found", id)
	}
	r := sandbox.Route{Addr: b.addr, Gone: b.gone, Boot: f.boot.Load(), Token: b.token, EnvdToken: b.envdToken, State: sandbox.StateRunning}
	if b.asleep {
		r.Addr, r.State, r.Wakes = "", sandbox.StatePaused, true
	}
	if check != nil {
		if err := check(r); err != nil {
			return r, err
		}
	}
	if b.asleep {
		b.asleep = false
		f.boxes[id] = b
		f.woken.Add(1)
		r.Addr, r.State, r.Wakes = b.addr, sandbox.StateRunning, false
	}
	return r, nil
}

func (f *fakeResolver) FindByToken(func(string) bool) (string, bool) { return "", false }

func (f *fakeResolver) DialSandbox(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, addr)
}

// setup starts a backend and a proxy that resolves sandbox "sb1" (any port)
// to it.
func setup(t *testing.T, backend http.Handler) (proxyURL string, gone chan struct{}) {
	t.Helper()
	be := httptest.NewServer(backend)
	t.Cleanup(be.Close)
	gone = make(chan struct{})
	// "dead" resolves to a loopback port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	r := &fakeResolver{boxes: map[string]fakeBox{
		"sb1":  {addr: be.Listener.Addr().String(), gone: gone},
		"dead": {addr: dead, gone: make(chan struct{})},
	}}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(ps.Close)
	return ps.URL, gone
}

// echo reports what the backend saw.
type echo struct {
	Host       string `json:"host"`
	Path       string `json:"path"`
	SandboxHdr string `json:"sandboxHdr"`
	PortHdr    string `json:"portHdr"`
	Forwarded  string `json:"forwarded"`
	Token      string `json:"token"`
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	json.NewEncoder(w).Encode(echo{
		Host: r.Host, Path: r.URL.RequestURI(),
		SandboxHdr: r.Header.Get("E2b-Sandbox-Id"), PortHdr: r.Header.Get("E2b-Sandbox-Port"),
		Forwarded: r.Header.Get("X-Forwarded-For"), Token: r.Header.Get("X-Access-Token"),
	})
}

func TestRouting(t *testing.T) {
	url, _ := setup(t, http.HandlerFunc(echoHandler))
	tests := []struct {
		name   string
		host   string
		hdr    map[string]string
		status int
	}{
		{"headers", "", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "49983"}, http.StatusOK},
		{"host", "49983-sb1.example.com", nil, http.StatusOK},
		{"headers win over host", "49983-other.example.com", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "49983"}, http.StatusOK},
		{"port not a number", "", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "http"}, http.StatusBadRequest},
		{"port missing", "", map[string]string{"E2b-Sandbox-Id": "sb1"}, http.StatusBadRequest},
		{"port zero", "", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "0"}, http.StatusBadRequest},
		{"port too big", "", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "65536"}, http.StatusBadRequest},
		{"port too big in host", "70000-sb1.example.com", nil, http.StatusBadRequest},
		{"port with a sign", "", map[string]string{"E2b-Sandbox-Id": "sb1", "E2b-Sandbox-Port": "+80"}, http.StatusBadRequest},
		{"sandbox ID not an ID", "", map[string]string{"E2b-Sandbox-Id": "sb1/../x", "E2b-Sandbox-Port": "80"}, http.StatusBadRequest},
		{"no routing at all", "example.com", nil, http.StatusBadRequest},
		{"unknown sandbox by header", "", map[string]string{"E2b-Sandbox-Id": "nope", "E2b-Sandbox-Port": "49983"}, http.StatusBadGateway},
		{"unknown sandbox by host", "49983-nope.example.com", nil, http.StatusBadGateway},
		{"nothing listening on the port", "49983-dead.example.com", nil, http.StatusBadGateway},
		{"paused sandbox", "49983-paused.example.com", nil, http.StatusBadGateway},
		{"sandbox changing state", "49983-busy.example.com", nil, http.StatusConflict},
		{"resume hit a limit", "49983-full.example.com", nil, http.StatusTooManyRequests},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", url+"/files?path=%2Ftmp%2Fx", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tt.host != "" {
				req.Host = tt.host
			}
			req.Header.Set("X-Access-Token", "tok")
			for k, v := range tt.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("got status %d (%s), want %d", resp.StatusCode, b, tt.status)
			}
			if tt.status != http.StatusOK {
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal(b, &e); err != nil || e.Code != tt.status || e.Message == "" {
					t.Errorf("got error body %q, want JSON {code: %d, message}", b, tt.status)
				}
				if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "application/json" {
					t.Errorf("got Content-Type %q, want application/json", resp.Header.Get("Content-Type"))
				}
				return
			}
			var got echo
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("backend answer %q: %v", b, err)
			}
			if got.Path != "/files?path=%2Ftmp%2Fx" {
				t.Errorf("backend got path %q, want /files?path=%%2Ftmp%%2Fx", got.Path)
			}
			if got.SandboxHdr != "" || got.PortHdr != "" {
				t.Errorf("backend got routing headers %q/%q, want them removed", got.SandboxHdr, got.PortHdr)
			}
			if got.Token != "tok" {
				t.Errorf("backend got X-Access-Token %q, want it passed through (envd checks it)", got.Token)
			}
			if got.Forwarded == "" {
				t.Errorf("backend got no X-Forwarded-For")
			}
			if want := req.Host; want != "" && got.Host != want {
				t.Errorf("backend got Host %q, want the client's %q", got.Host, want)
			}
		})
	}
}

func TestStreaming(t *testing.T) {
	release := make(chan struct{})
	finished := make(chan struct{})
	url, _ := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(finished)
		fmt.Fprintln(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprintln(w, "second")
	}))
	req, _ := http.NewRequest("POST", url+"/process.Process/Start", strings.NewReader("{}"))
	req.Header.Set("E2b-Sandbox-Id", "sb1")
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("got first chunk %q (%v), want %q", line, err, "first\n")
	}
	// The backend is still blocked: the first chunk came through on its own.
	select {
	case <-finished:
		t.Fatal("backend finished before the first chunk was read")
	default:
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "second\n" {
		t.Errorf("got rest %q (%v), want %q", rest, err, "second\n")
	}
}

func TestGoneEndsStream(t *testing.T) {
	backendDone := make(chan error, 1)
	url, gone := setup(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "first")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			backendDone <- r.Context().Err()
		case <-time.After(30 * time.Second):
			backendDone <- errors.New("the proxy kept the backend request open")
		}
	}))
	req, _ := http.NewRequest("GET", url+"/", nil)
	req.Host = "49983-sb1.example.com"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("got first chunk %q (%v), want %q", line, err, "first\n")
	}
	readDone := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(br)
		readDone <- err
	}()
	close(gone) // the sandbox went away
	select {
	case <-readDone:
		// Any end (EOF or error) will do: the request must not hang.
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request still open 5 s after the sandbox went away")
	}
	select {
	case err := <-backendDone:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("backend request ended with %v, want it cancelled", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("backend request still open 5 s after the sandbox went away")
	}
}

// A connection to a sandbox must not be reused for another sandbox that
// resolves to the same address (a new sandbox in a recycled slot).
func TestConnectionsPooledPerSandbox(t *testing.T) {
	var mu sync.Mutex
	conns := map[string]bool{}
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		conns[r.RemoteAddr] = true
		mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(be.Close)
	addr := be.Listener.Addr().String()
	r := &fakeResolver{boxes: map[string]fakeBox{
		"sb1": {addr: addr, gone: make(chan struct{})},
		"sb2": {addr: addr, gone: make(chan struct{})},
	}}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(ps.Close)
	for _, id := range []string{"sb1", "sb1", "sb2", "sb2"} {
		req, _ := http.NewRequest("GET", ps.URL+"/", nil)
		req.Host = "8080-" + id + ".example.com"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mu.Lock()
	defer mu.Unlock()
	if got := len(conns); got != 2 {
		t.Errorf("got %d backend connections for 2 requests to each of 2 sandboxes, want 2 (one per sandbox, reused)", got)
	}
}

// A paused (or unknown) sandbox answers a Connect stream as E2B's proxy
// does, a plain 502, which Connect clients read as "unavailable" (the SDK
// then says the sandbox was not found, likely timed out).
func TestPausedConnectStream(t *testing.T) {
	url, _ := setup(t, http.HandlerFunc(echoHandler))
	hc := &http.Client{Transport: routeTransport{id: "paused"}}
	for _, opts := range [][]connect.ClientOption{{connect.WithProtoJSON()}, nil} {
		proc := processpbconnect.NewProcessClient(hc, url, opts...)
		s, err := proc.Start(context.Background(), connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true"}}))
		if err == nil {
			for s.Receive() {
				t.Errorf("got message %v from a paused sandbox", s.Msg())
			}
			err = s.Err()
			s.Close()
		}
		if got := connect.CodeOf(err); got != connect.CodeUnavailable {
			t.Errorf("got stream error %v, want unavailable (HTTP 502)", err)
		}
	}
}

// The bodies are E2B's: {sandboxId, message, code} (and port when nothing
// listens on it), as JSON with a charset.
func TestE2BErrorBodies(t *testing.T) {
	url, _ := setup(t, http.HandlerFunc(echoHandler))
	tests := []struct {
		host string
		want map[string]any
	}{
		{"49983-nope.example.com", map[string]any{"sandboxId": "nope", "message": "The sandbox was not found", "code": 502.0}},
		{"49983-paused.example.com", map[string]any{"sandboxId": "paused", "message": "The sandbox was not found", "code": 502.0}},
		{"8080-dead.example.com", map[string]any{"sandboxId": "dead", "message": "The sandbox is running but port is not open", "port": 8080.0, "code": 502.0}},
		{"49983-busy.example.com", map[string]any{"sandboxId": "busy", "message": "The sandbox is still transitioning. Try again in a moment.", "code": 409.0}},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest("GET", url+"/health", nil)
		req.Host = tt.host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got body %v (%v), want %v", tt.host, got, err, tt.want)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
			t.Errorf("%s: got Content-Type %q, want application/json; charset=utf-8", tt.host, ct)
		}
	}
}

// A sandbox that boots again gets new connections: one pooled for the
// previous boot is never reused (it may lead to another sandbox now).
func TestConnectionsPooledPerBoot(t *testing.T) {
	serve := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) }))
		t.Cleanup(s.Close)
		return s
	}
	first, second := serve("first"), serve("second")
	r := &fakeResolver{boxes: map[string]fakeBox{"sb1": {addr: first.Listener.Addr().String(), gone: make(chan struct{})}}}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(ps.Close)
	get := func() string {
		req, _ := http.NewRequest("GET", ps.URL+"/", nil)
		req.Host = "8080-sb1.example.com"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get(); got != "first" {
		t.Fatalf("got %q, want first", got)
	}
	r.mu.Lock()
	r.boxes["sb1"] = fakeBox{addr: second.Listener.Addr().String(), gone: make(chan struct{})}
	r.mu.Unlock()
	r.boot.Add(1)
	if got := get(); got != "second" {
		t.Errorf("after a new boot got %q, want second (a connection of the previous boot was reused)", got)
	}
}

// routeTransport adds the E2B routing headers for sandbox id, port 49983.
type routeTransport struct{ id string }

func (rt routeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", rt.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	return http.DefaultTransport.RoundTrip(r)
}

// A sandbox with a traffic token refuses requests to its exposed ports
// without it (E2B's 403 texts), lets envd's port through, and the header
// does not reach the sandbox.
func TestTrafficToken(t *testing.T) {
	var seen atomic.Value
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(proxy.TrafficTokenHeader))
	}))
	defer be.Close()
	r := &fakeResolver{boxes: map[string]fakeBox{"sb1": {addr: be.Listener.Addr().String(), gone: make(chan struct{}), token: "tt"}}}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer ps.Close()
	for _, tt := range []struct {
		name, host, token string
		status            int
		msg               string
	}{
		{"missing", "8080-sb1.example.com", "", http.StatusForbidden, "Token header 'e2b-traffic-access-token' is missing"},
		{"invalid", "8080-sb1.example.com", "nope", http.StatusForbidden, "Provided token in header 'e2b-traffic-access-token' is invalid"},
		{"valid", "8080-sb1.example.com", "tt", http.StatusOK, ""},
		{"envd exempt", "49983-sb1.example.com", "", http.StatusOK, ""},
	} {
		req, _ := http.NewRequest("GET", ps.URL+"/", nil)
		req.Host = tt.host
		if tt.token != "" {
			req.Header.Set(proxy.TrafficTokenHeader, tt.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.msg) {
			t.Errorf("%s: got %d %s, want %d with %q", tt.name, resp.StatusCode, b, tt.status, tt.msg)
		}
	}
	if got := seen.Load(); got != "" {
		t.Errorf("the sandbox saw traffic token header %q, want none", got)
	}
}

// countingResolver counts look-ups.
type countingResolver struct {
	*fakeResolver
	n atomic.Int64
}

func (c *countingResolver) Resolve(id string, port int, check func(sandbox.Route) error) (sandbox.Route, error) {
	c.n.Add(1)
	return c.fakeResolver.Resolve(id, port, check)
}

// The proxy looks a sandbox up once per request, new connections included
// (a second look-up could pair one boot's pool key with the next boot's
// address or gone channel).
func TestResolveOncePerRequest(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer be.Close()
	r := &countingResolver{fakeResolver: &fakeResolver{boxes: map[string]fakeBox{"sb1": {addr: be.Listener.Addr().String(), gone: make(chan struct{})}}}}
	ps := httptest.NewServer(proxy.New(r, slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer ps.Close()
	for i := range 3 {
		req, _ := http.NewRequest("GET", ps.URL+"/", nil)
		req.Host = "8080-sb1.example.com"
		req.Close = true
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := r.n.Load(); got != int64(i+1) {
			t.Fatalf("after %d requests: %d look-ups, want %d", i+1, got, i+1)
		}
	}
}
