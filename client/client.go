// Package client is the Go client of agentenv: create, list, pause, resume,
// connect to, snapshot, fork and kill sandboxes through agentenv's REST API,
// and run commands (their output streamed), move files and drive terminals
// inside them through envd, the daemon in every sandbox, which the sandbox
// proxy reaches. It does for Go what the Python SDK (sdk/python) and E2B's
// SDKs do.
//
// A Client needs the API's URL (`agentenv serve` listens on
// http://127.0.0.1:3000), the proxy's (port 3001 of the same host) and an
// API key:
//
//	c := client.New("http://127.0.0.1:3000", "http://127.0.0.1:3001", os.Getenv("AGENTENV_API_KEY"))
//	timeout := int64(60) // seconds
//	sb, err := c.CreateSandbox(ctx, client.CreateRequest{TemplateID: "busybox", Timeout: &timeout})
//	...
//	res, err := c.Exec(ctx, sb, "echo", []string{"hello"}, os.Stdout, os.Stderr)
//
// The bodies it sends and receives are the types of package
// github.com/agentenv/agentenv/client/api, which the server uses too and a test
// checks against api/openapi.yaml; this package names the ones its methods
// take (Sandbox, CreateRequest, Snapshot...) as aliases, so one import is
// enough. An error the server answers is an *Error; an envd call to a
// sandbox that is paused or gone is a *NotRunningError that says which.
//
// It must not import the server's packages: it builds on any OS.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Client talks to one agentenv server.
type Client struct {
	API    string // e.g. http://127.0.0.1:3000
	Proxy  string // e.g. http://127.0.0.1:3001
	APIKey string
	HTTP   *http.Client
}

// New returns a client with pooled connections.
func New(api, proxy, key string) *Client {
	return &Client{API: strings.TrimRight(api, "/"), Proxy: strings.TrimRight(proxy, "/"), APIKey: key,
		HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil || resp.StatusCode == http.StatusNoContent {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.API+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.roundTrip(req)
}

// roundTrip sends an API request with the key and turns error answers into
// *Error.
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	req.Header.Set("X-API-Key", c.APIKey)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the agentenv server at %s (is `agentenv serve` running? set --server or AGENTENV_SERVER): %w", c.API, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		e := &Error{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		e.Status = resp.StatusCode
		return nil, e
	}
	return resp, nil
}

// portTransport adds the proxy's routing headers (which sandbox, which
// port) and the token the port needs.
type portTransport struct {
	base      http.RoundTripper
	id        string
	port      int
	tokenName string
	token     string
}

func (t *portTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", t.id)
	r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(t.port))
	if t.token != "" {
		r.Header.Set(t.tokenName, t.token)
	}
	return t.base.RoundTrip(r)
}

// Port returns an HTTP client whose requests reach port of the sandbox
// through the proxy (a server the sandbox runs, say), and the base URL to
// use with it. A sandbox created with Network.AllowPublicTraffic false
// needs its TrafficAccessToken, which this adds (sb must come from create,
// get or connect: lists leave tokens out).
func (c *Client) Port(sb Sandbox, port int) (*http.Client, string) {
	if port == EnvdPort {
		return c.Envd(sb)
	}
	return c.portClient(sb.SandboxID, port, "E2b-Traffic-Access-Token", sb.TrafficAccessToken), c.Proxy
}

// Envd returns an HTTP client whose requests reach the sandbox's envd
// through the proxy, and the base URL to use with it.
func (c *Client) Envd(sb Sandbox) (*http.Client, string) {
	return c.portClient(sb.SandboxID, EnvdPort, "X-Access-Token", sb.EnvdAccessToken), c.Proxy
}

func (c *Client) portClient(id string, port int, tokenName, token string) *http.Client {
	base := c.HTTP.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: &portTransport{base: base, id: id, port: port, tokenName: tokenName, token: token}}
}
