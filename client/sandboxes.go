package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentenv/agentenv/client/api"
)

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
	timeout := int64(seconds)
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", api.TimeoutRequest{Timeout: &timeout}, nil)
}

// ConnectSandbox is E2B's connect: a paused sandbox is resumed, a running
// one returned as it is; req.Timeout, when set, makes it end at least that
// many seconds from now (connect never shortens a life).
func (c *Client) ConnectSandbox(ctx context.Context, id string, req ConnectRequest) (Sandbox, error) {
	var sb Sandbox
	err := c.do(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", req, &sb)
	return sb, err
}

// RefreshSandbox keeps a running sandbox alive at least seconds more (its
// life is never shortened).
func (c *Client) RefreshSandbox(ctx context.Context, id string, seconds int64) error {
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/refreshes", api.RefreshRequest{Duration: &seconds}, nil)
}

// UpdateNetwork changes a running sandbox's egress policy; fields left nil
// keep their value.
func (c *Client) UpdateNetwork(ctx context.Context, id string, req api.NetworkUpdate) error {
	return c.do(ctx, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/network", req, nil)
}

// PauseSandboxFiles pauses a sandbox keeping only its files (E2B's pause
// with memory: false): nothing of it stays in memory, and a resume boots
// it again with its files.
func (c *Client) PauseSandboxFiles(ctx context.Context, id string) error {
	memory := false
	return c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", api.PauseRequest{Memory: &memory}, nil)
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
