package client

import (
	"context"
	"net/http"
	"net/url"
)

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
