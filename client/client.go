// Package client is the Go client of agentenv's REST API and of envd through
// the sandbox proxy. The CLI and the benchmarks use it.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/api"
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

// CreateSandbox creates a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req CreateRequest) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodPost, "/sandboxes", req, &sb)
	return sb, err
}

// ListSandboxes lists running and paused sandboxes, optionally filtered
// by metadata, newest first. It follows the server's pages to the end.
func (c *Client) ListSandboxes(ctx context.Context, metadata map[string]string) ([]Sandbox, error) {
	q := url.Values{}
	if len(metadata) > 0 {
		m := url.Values{}
		for k, v := range metadata {
			m.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		q.Set("metadata", m.Encode())
	}
	var out []Sandbox
	for {
		page, next, err := c.ListSandboxesPage(ctx, q)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" {
			return out, nil
		}
		q.Set("nextToken", next)
	}
}

// ListSandboxesPage answers one GET /v2/sandboxes with the query q (E2B's
// parameters: metadata, state, template, startedAfter, order, limit,
// nextToken) and returns the token of the next page ("" after the last).
func (c *Client) ListSandboxesPage(ctx context.Context, q url.Values) ([]Sandbox, string, error) {
	path := "/v2/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	var out []Sandbox
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, "", fmt.Errorf("reading the sandbox list: %w", err)
	}
	return out, resp.Header.Get("X-Next-Token"), nil
}

// SandboxMetrics samples one sandbox's resource use (a list of one).
func (c *Client) SandboxMetrics(ctx context.Context, id string) ([]Metric, error) {
	var out []Metric
	err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id)+"/metrics", nil, &out)
	return out, err
}

// SandboxesMetrics samples several sandboxes; unknown ones are left out.
func (c *Client) SandboxesMetrics(ctx context.Context, ids []string) (map[string]Metric, error) {
	var out api.SandboxesMetrics
	err := c.do(ctx, http.MethodGet, "/sandboxes/metrics?sandbox_ids="+url.QueryEscape(strings.Join(ids, ",")), nil, &out)
	return out.Sandboxes, err
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &sb)
	return sb, err
}

// KillSandbox kills a sandbox.
func (c *Client) KillSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
}

// SetTimeout sets a sandbox's remaining life.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", api.TimeoutRequest{Timeout: new(int64(seconds))}, nil)
}

// ListTemplates lists templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out []Template
	err := c.do(ctx, http.MethodGet, "/templates", nil, &out)
	return out, err
}

// DeleteTemplate deletes a template.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(name), nil, nil)
}

// BuildTemplate builds a template, calling progress for each step.
func (c *Client) BuildTemplate(ctx context.Context, req BuildRequest, progress func(BuildProgress)) (Template, error) {
	resp, err := c.send(ctx, http.MethodPost, "/agentenv/templates", req)
	if err != nil {
		return Template{}, err
	}
	return readBuildStream(resp, progress)
}

// UploadTemplate builds a template from a rootfs tar stream (plain or
// gzip), calling progress for each step.
func (c *Client) UploadTemplate(ctx context.Context, name string, tarball io.Reader, progress func(BuildProgress)) (Template, error) {
	return c.UploadTemplateWith(ctx, BuildRequest{Name: name}, tarball, progress)
}

// UploadTemplateWith is UploadTemplate with the image label and settings
// of b (its source fields are not used).
func (c *Client) UploadTemplateWith(ctx context.Context, b BuildRequest, tarball io.Reader, progress func(BuildProgress)) (Template, error) {
	q := url.Values{}
	for k, v := range map[string]string{"image": b.Image, "workdir": b.Workdir, "user": b.User, "startCmd": b.StartCmd, "readyCmd": b.ReadyCmd} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if b.DiskMB != 0 {
		q.Set("diskMB", strconv.Itoa(b.DiskMB))
	}
	if b.ReadyTimeout != 0 {
		q.Set("readyTimeout", fmt.Sprint(b.ReadyTimeout))
	}
	for k, v := range b.Env {
		q.Add("env", k+"="+v)
	}
	u := c.API + "/agentenv/templates/" + url.PathEscape(b.Name) + "/rootfs"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, tarball)
	if err != nil {
		return Template{}, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.roundTrip(req)
	if err != nil {
		return Template{}, err
	}
	return readBuildStream(resp, progress)
}

func readBuildStream(resp *http.Response, progress func(BuildProgress)) (Template, error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return Template{}, fmt.Errorf("bad build stream line: %w", err)
		}
		switch {
		case ev.Progress != nil:
			progress(*ev.Progress)
		case ev.Error != nil:
			return Template{}, ev.Error
		case ev.Template != nil:
			return *ev.Template, nil
		}
	}
	if err := sc.Err(); err != nil {
		return Template{}, err
	}
	return Template{}, fmt.Errorf("build stream ended without a result")
}

// envdTransport adds the proxy routing headers and the access token.
type envdTransport struct {
	base  http.RoundTripper
	id    string
	token string
}

func (t *envdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", t.id)
	r.Header.Set("E2b-Sandbox-Port", fmt.Sprint(EnvdPort))
	if t.token != "" {
		r.Header.Set("X-Access-Token", t.token)
	}
	return t.base.RoundTrip(r)
}

// Envd returns an HTTP client whose requests reach the sandbox's envd
// through the proxy, and the base URL to use with it.
func (c *Client) Envd(sb Sandbox) (*http.Client, string) {
	base := c.HTTP.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	return &http.Client{Transport: &envdTransport{base: base, id: sb.SandboxID, token: sb.EnvdAccessToken}}, c.Proxy
}

// ExecResult is the outcome of a command.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// Exec runs cmd with args in the sandbox through envd and waits for it.
// stdout/stderr, when not nil, receive the output as it streams.
func (c *Client) Exec(ctx context.Context, sb Sandbox, cmd string, args []string, stdout, stderr io.Writer) (ExecResult, error) {
	p, err := c.StartProcess(ctx, sb, ProcessRequest{Cmd: cmd, Args: args})
	if err != nil {
		return ExecResult{}, err
	}
	return p.Wait(stdout, stderr)
}

// PauseSandbox freezes a sandbox.
func (c *Client) PauseSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", struct{}{}, nil)
}

// ResumeSandbox continues a paused sandbox.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/resume", struct{}{}, &sb)
	return sb, err
}

// SnapshotSandbox snapshots a running sandbox.
func (c *Client) SnapshotSandbox(ctx context.Context, id, name string, metadata map[string]string) (Snapshot, error) {
	var sn Snapshot
	err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots",
		api.SnapshotRequest{Name: name, Metadata: metadata}, &sn)
	return sn, err
}

// ForkSandbox forks a sandbox into count children. Children that failed
// come back as errors in the same positions.
func (c *Client) ForkSandbox(ctx context.Context, id string, count int) ([]Sandbox, []error, error) {
	var out []api.ForkResult
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", api.ForkRequest{Count: &count}, &out); err != nil {
		return nil, nil, err
	}
	sbs := make([]Sandbox, len(out))
	errs := make([]error, len(out))
	for i, o := range out {
		if o.Sandbox != nil {
			sbs[i] = *o.Sandbox
		}
		if o.Error != nil {
			errs[i] = o.Error
		}
	}
	return sbs, errs, nil
}

// ListSnapshots lists snapshots, optionally of one sandbox.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]Snapshot, error) {
	var out []Snapshot
	path := "/snapshots"
	if sandboxID != "" {
		path += "?sandboxID=" + url.QueryEscape(sandboxID)
	}
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// SnapshotByName returns the snapshot named name; ok is false when none
// is, and two or more are an error that lists their IDs.
func (c *Client) SnapshotByName(ctx context.Context, name string) (sn Snapshot, ok bool, err error) {
	if name == "" {
		return Snapshot{}, false, nil
	}
	all, err := c.ListSnapshots(ctx, "")
	if err != nil {
		return Snapshot{}, false, err
	}
	var ids []string
	for _, s := range all {
		if s.Name == name {
			sn = s
			ids = append(ids, s.SnapshotID)
		}
	}
	if len(ids) > 1 {
		return Snapshot{}, false, fmt.Errorf("%d snapshots are named %q (%s): give one's ID", len(ids), name, strings.Join(ids, ", "))
	}
	return sn, len(ids) == 1, nil
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/snapshots/"+url.PathEscape(id), nil, nil)
}

// Nodes lists a fleet's nodes (an `agentenv api` server only).
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out []Node
	err := c.do(ctx, http.MethodGet, "/agentenv/nodes", nil, &out)
	return out, err
}

// NodeAction cordons, uncordons or drains a fleet node.
func (c *Client) NodeAction(ctx context.Context, name, action string) error {
	return c.do(ctx, http.MethodPost, "/agentenv/nodes/"+url.PathEscape(name)+"/"+action, nil, nil)
}
