package client

import (
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/client/api/envd/filesystempb/filesystempbconnect"
)

// Files is a sandbox's filesystem through envd, as one user. Every call
// streams: nothing is held whole in memory.
type Files struct {
	c    *Client
	sb   Sandbox
	user string
	hc   *http.Client
	base string
	fs   filesystempbconnect.FilesystemClient
}

// Files returns the sandbox's filesystem as user (empty: envd's default
// user).
func (c *Client) Files(sb Sandbox, user string) *Files {
	hc, base := c.Envd(sb)
	return &Files{c: c, sb: sb, user: user, hc: hc, base: base, fs: filesystempbconnect.NewFilesystemClient(hc, base)}
}

// Entry is a file, directory or symlink in a sandbox.
type Entry struct {
	Name string
	Path string
	// Dir is true for a directory (or a symlink to one).
	Dir  bool
	Size int64
	Mode fs.FileMode // permission bits
	// Symlink is the resolved target of a symlink ("" for other entries).
	Symlink string
}

func toEntry(e *filesystempb.EntryInfo) Entry {
	return Entry{Name: e.GetName(), Path: e.GetPath(), Dir: e.GetType() == filesystempb.FileType_FILE_TYPE_DIRECTORY,
		Size: e.GetSize(), Mode: fs.FileMode(e.GetMode()).Perm(), Symlink: e.GetSymlinkTarget()}
}

// Stat describes path (a symlink as itself, with its target's type).
func (f *Files) Stat(ctx context.Context, path string) (Entry, error) {
	req := connect.NewRequest(&filesystempb.StatRequest{Path: path})
	basicUser(req.Header(), f.user)
	resp, err := f.fs.Stat(ctx, req)
	if err != nil {
		return Entry{}, f.c.explain(ctx, f.sb, err)
	}
	return toEntry(resp.Msg.GetEntry()), nil
}

// Exists reports whether path exists (a dangling symlink does).
func (f *Files) Exists(ctx context.Context, path string) (bool, error) {
	_, err := f.Stat(ctx, path)
	if connect.CodeOf(err) == connect.CodeNotFound {
		return false, nil
	}
	return err == nil, err
}

// List returns the entries of directory path (not their children).
func (f *Files) List(ctx context.Context, path string) ([]Entry, error) {
	req := connect.NewRequest(&filesystempb.ListDirRequest{Path: path, Depth: 1})
	basicUser(req.Header(), f.user)
	resp, err := f.fs.ListDir(ctx, req)
	if err != nil {
		return nil, f.c.explain(ctx, f.sb, err)
	}
	out := make([]Entry, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		out = append(out, toEntry(e))
	}
	return out, nil
}

// MakeDir makes directory path and its parents; one that exists is fine.
func (f *Files) MakeDir(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystempb.MakeDirRequest{Path: path})
	basicUser(req.Header(), f.user)
	_, err := f.fs.MakeDir(ctx, req)
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		return nil
	}
	return f.c.explain(ctx, f.sb, err)
}

// Remove removes the file or directory (with its contents) at path.
func (f *Files) Remove(ctx context.Context, path string) error {
	req := connect.NewRequest(&filesystempb.RemoveRequest{Path: path})
	basicUser(req.Header(), f.user)
	_, err := f.fs.Remove(ctx, req)
	return f.c.explain(ctx, f.sb, err)
}

// Rename moves the entry at from to to and describes it there.
func (f *Files) Rename(ctx context.Context, from, to string) (Entry, error) {
	req := connect.NewRequest(&filesystempb.MoveRequest{Source: from, Destination: to})
	basicUser(req.Header(), f.user)
	resp, err := f.fs.Move(ctx, req)
	if err != nil {
		return Entry{}, f.c.explain(ctx, f.sb, err)
	}
	return toEntry(resp.Msg.GetEntry()), nil
}

// Open streams the file at path; close it when done.
func (f *Files) Open(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := f.do(ctx, http.MethodGet, path, nil, "read "+path)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Write streams r into the file at path, made with its parents if missing
// (mode 0644), else overwritten.
func (f *Files) Write(ctx context.Context, path string, r io.Reader) error {
	resp, err := f.do(ctx, http.MethodPost, path, r, "write "+path)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func (f *Files) do(ctx context.Context, method, path string, body io.Reader, op string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, f.base+"/files?path="+url.QueryEscape(path), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	basicUser(req.Header, f.user)
	resp, err := f.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, f.c.explain(ctx, f.sb, &statusError{Op: op, Status: resp.StatusCode, Message: envdMessage(b)})
	}
	return resp, nil
}

// envdMessage is the message of envd's JSON error body, else the body.
func envdMessage(b []byte) string {
	var e Error
	if err := json.Unmarshal(b, &e); err == nil && e.Message != "" {
		return e.Message
	}
	return strings.TrimSpace(string(b))
}

// WriteFile writes data to path in the sandbox (POST /files) as envd's
// default user.
func (c *Client) WriteFile(ctx context.Context, sb Sandbox, path string, data io.Reader) error {
	return c.Files(sb, "").Write(ctx, path, data)
}

// ReadFile reads a file from the sandbox (GET /files) as envd's default
// user.
func (c *Client) ReadFile(ctx context.Context, sb Sandbox, path string) ([]byte, error) {
	r, err := c.Files(sb, "").Open(ctx, path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}
