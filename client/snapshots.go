package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentenv/agentenv/client/api"
)

// SnapshotSandbox snapshots a running sandbox.
func (c *Client) SnapshotSandbox(ctx context.Context, id, name string, metadata map[string]string) (Snapshot, error) {
	var sn Snapshot
	err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots",
		api.SnapshotRequest{Name: name, Metadata: metadata}, &sn)
	return sn, err
}

// ForkSandbox forks a running sandbox into count children, each a copy of
// its memory, processes and files at one moment. Children that failed
// come back as errors in the same positions.
func (c *Client) ForkSandbox(ctx context.Context, id string, count int) ([]Sandbox, []error, error) {
	return c.ForkSandboxWith(ctx, id, api.ForkRequest{Count: &count})
}

// ForkSandboxWith is ForkSandbox with the children's timeout and metadata.
func (c *Client) ForkSandboxWith(ctx context.Context, id string, req api.ForkRequest) ([]Sandbox, []error, error) {
	var out []api.ForkResult
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", req, &out); err != nil {
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

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	var sn Snapshot
	err := c.do(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(id), nil, &sn)
	return sn, err
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
