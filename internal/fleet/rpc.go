package fleet

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/api"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
)

// The node RPC: the api.Backend methods as JSON over HTTP, so an API
// server runs the very same REST handlers against a node's sandboxes.
// Every request carries a proof of the cluster secret (AuthHeader); a
// node answers nothing without it, and with mutual TLS configured nothing
// to a caller without a certificate of the fleet's CA.

const rpcPath = "/fleet/v1/"

// rpcArgs holds the arguments of any method (each uses some).
type rpcArgs struct {
	ID       string                   `json:"id,omitempty"`
	Name     string                   `json:"name,omitempty"`
	D        time.Duration            `json:"d,omitempty"`
	Count    int                      `json:"count,omitempty"`
	Metadata map[string]string        `json:"metadata,omitempty"`
	Create   *sandbox.CreateRequest   `json:"create,omitempty"`
	Filter   *sandbox.Filter          `json:"filter,omitempty"`
	Network  *sandbox.Network         `json:"network,omitempty"`
	Snapshot *sandbox.SnapshotRequest `json:"snapshot,omitempty"`
}

// wireError is an error as it crosses the wire: its class code and text.
type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	_, code := errdefs.HTTPStatus(err)
	return &wireError{Code: code, Message: err.Error()}
}

func (e *wireError) err() error {
	if e == nil {
		return nil
	}
	return errdefs.FromCode(e.Code, e.Message)
}

type forkResult struct {
	Sandbox sandbox.Sandbox `json:"sandbox"`
	Err     *wireError      `json:"error,omitempty"`
}

// buildEvent is one line of a streamed build.
type buildEvent struct {
	Progress *template.Progress `json:"progress,omitempty"`
	Template *api.TemplateInfo  `json:"template,omitempty"`
	Error    *wireError         `json:"error,omitempty"`
}

func writeWireError(w http.ResponseWriter, err error) {
	status, _ := errdefs.HTTPStatus(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(toWire(err))
}

// serveRPC answers one Backend call.
func serveRPC(b api.Backend, w http.ResponseWriter, r *http.Request, method string) {
	var a rpcArgs
	if err := json.NewDecoder(io.LimitReader(r.Body, api.MaxBody)).Decode(&a); err != nil && !errors.Is(err, io.EOF) {
		writeWireError(w, errdefs.Invalid("fleet rpc %s: malformed arguments: %v", method, err))
		return
	}
	ctx := r.Context()
	var out any
	var err error
	switch method {
	case "Create":
		if a.Create == nil {
			err = errdefs.Invalid("Create needs a request")
			break
		}
		out, err = b.Create(ctx, *a.Create)
	case "List":
		var f sandbox.Filter
		if a.Filter != nil {
			f = *a.Filter
		}
		out, err = b.List(ctx, f)
	case "Get":
		out, err = b.Get(ctx, a.ID)
	case "Kill":
		err = b.Kill(ctx, a.ID)
	case "Metrics":
		out, err = b.Metrics(ctx, a.ID)
	case "SetTimeout":
		out, err = b.SetTimeout(ctx, a.ID, a.D)
	case "Extend":
		out, err = b.Extend(ctx, a.ID, a.D)
	case "SetNetwork":
		if a.Network == nil {
			err = errdefs.Invalid("SetNetwork needs a network")
			break
		}
		out, err = b.SetNetwork(ctx, a.ID, *a.Network)
	case "Pause":
		out, err = b.Pause(ctx, a.ID)
	case "PauseFiles":
		fp, ok := b.(api.FilesPauser)
		if !ok {
			err = errdefs.Invalid("this node cannot pause keeping only files: pause with memory")
			break
		}
		out, err = fp.PauseFiles(ctx, a.ID)
	case "Resume":
		out, err = b.Resume(ctx, a.ID, a.D)
	case "Snapshot":
		var req sandbox.SnapshotRequest
		if a.Snapshot != nil {
			req = *a.Snapshot
		}
		out, err = b.Snapshot(ctx, a.ID, req)
	case "Fork":
		var res []sandbox.ForkResult
		if res, err = b.Fork(ctx, a.ID, a.Count, a.D, a.Metadata); err == nil {
			wire := make([]forkResult, len(res))
			for i, fr := range res {
				wire[i] = forkResult{Sandbox: fr.Sandbox, Err: toWire(fr.Err)}
			}
			out = wire
		}
	case "ListSnapshots":
		out, err = b.ListSnapshots(ctx, a.ID)
	case "GetSnapshot":
		out, err = b.GetSnapshot(ctx, a.ID)
	case "DeleteSnapshot":
		err = b.DeleteSnapshot(ctx, a.ID)
	case "ListTemplates":
		out, err = b.ListTemplates(ctx)
	case "GetTemplate":
		out, err = b.GetTemplate(ctx, a.Name)
	case "DeleteTemplate":
		err = b.DeleteTemplate(ctx, a.Name)
	default:
		err = errdefs.NotFound("fleet rpc has no method %q (node and API server of different versions?)", method)
	}
	if err != nil {
		writeWireError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// serveBuild runs a template build: the request in a header, the upload
// (if any) as the body, progress streamed back as NDJSON.
func serveBuild(b api.Backend, w http.ResponseWriter, r *http.Request) {
	var req template.BuildRequest
	raw, err := base64.StdEncoding.DecodeString(r.Header.Get("X-Agentenv-Build"))
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		writeWireError(w, errdefs.Invalid("fleet build: malformed request header: %v", err))
		return
	}
	if r.Header.Get("X-Agentenv-Upload") == "1" {
		http.NewResponseController(w).EnableFullDuplex()
		req.Upload = r.Body
	}
	enc := json.NewEncoder(w)
	started := false
	emit := func(ev buildEvent) {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		enc.Encode(ev)
		http.NewResponseController(w).Flush()
	}
	t, err := b.BuildTemplate(r.Context(), req, func(p template.Progress) { emit(buildEvent{Progress: &p}) })
	switch {
	case err != nil && !started:
		writeWireError(w, err)
	case err != nil:
		emit(buildEvent{Error: toWire(err)})
	default:
		emit(buildEvent{Template: &t})
	}
}

// nodeClient calls one node: it implements api.Backend for that node's
// sandboxes.
type nodeClient struct {
	name, addr string
	tls        bool // the node serves TLS
	// needTLS: this caller may not reach a node over plain HTTP.
	needTLS bool
	auth    rpcAuth
	http    *http.Client
	// gone, if set, is closed when the node is lost: calls to it end.
	gone <-chan struct{}
}

func (c *nodeClient) url(method string) (string, error) {
	base, err := NodeRecord{Name: c.name, Addr: c.addr, TLS: c.tls}.baseURL(c.needTLS)
	return base + rpcPath + method, err
}

// errOutcomeUnknown marks a call that may have been carried out although
// no answer came (a create must then not be retried elsewhere).
var errOutcomeUnknown = errors.New("the outcome is unknown")

// isDialError reports whether err happened before the request left (no
// connection could be made).
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// quickTimeout bounds the calls that only read or flip a sandbox's
// state; creates, forks, snapshots, resumes and builds take as long as
// they take (they end when the node is lost or the caller gives up).
const quickTimeout = 30 * time.Second

var slowMethods = map[string]bool{"Create": true, "Fork": true, "Snapshot": true, "Resume": true}

// bound returns ctx ended by the method's timeout and by the node's loss.
func (c *nodeClient) bound(ctx context.Context, method string) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if slowMethods[method] || method == "build" {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, quickTimeout)
	}
	if c.gone != nil {
		stop := make(chan struct{})
		go func() {
			select {
			case <-c.gone:
				cancel()
			case <-stop:
			}
		}()
		return ctx, func() { close(stop); cancel() }
	}
	return ctx, cancel
}

// lostDuring reports whether the node was lost (the reason a call ended).
func (c *nodeClient) lostDuring() bool {
	if c.gone == nil {
		return false
	}
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

var _ api.Backend = (*nodeClient)(nil)

// newTransport is the HTTP transport API servers (and nodes copying from
// peers) use to reach nodes; tlsConf verifies nodes that serve TLS.
func newTransport(tlsConf *tls.Config) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     tlsConf,
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

func (c *nodeClient) unreachable(err error) error {
	return errdefs.Unavailable("node %s (%s) did not answer: %v; retry in a moment", c.name, c.addr, err)
}

func (c *nodeClient) call(parent context.Context, method string, a rpcArgs, out any) error {
	body, err := json.Marshal(a)
	if err != nil {
		return err
	}
	u, err := c.url(method)
	if err != nil {
		return err
	}
	ctx, cancel := c.bound(parent, method)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	c.auth.sign(req)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		if c.lostDuring() {
			return fmt.Errorf("node %s was lost during the call (its lease expired): the outcome is unknown; check and retry: %w", c.name, errors.Join(errOutcomeUnknown, errdefs.ErrUnavailable))
		}
		if parent.Err() != nil {
			return parent.Err()
		}
		if !isDialError(err) {
			// The request may have reached the node.
			return fmt.Errorf("%w: %w", errOutcomeUnknown, c.unreachable(err))
		}
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readWireError(resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%w: %w", errOutcomeUnknown, c.unreachable(fmt.Errorf("reading the answer to %s: %w", method, err)))
	}
	return nil
}

func readWireError(resp *http.Response) error {
	var we wireError
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &we) != nil || we.Message == "" {
		return errdefs.Unavailable("node answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return we.err()
}

func (c *nodeClient) sandbox(ctx context.Context, method string, a rpcArgs) (sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	err := c.call(ctx, method, a, &sb)
	return sb, err
}

func (c *nodeClient) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "Create", rpcArgs{Create: &req})
}

func (c *nodeClient) List(ctx context.Context, f sandbox.Filter) ([]sandbox.Sandbox, error) {
	var out []sandbox.Sandbox
	err := c.call(ctx, "List", rpcArgs{Filter: &f}, &out)
	return out, err
}

func (c *nodeClient) Get(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "Get", rpcArgs{ID: id})
}

func (c *nodeClient) Kill(ctx context.Context, id string) error {
	return c.call(ctx, "Kill", rpcArgs{ID: id}, nil)
}

func (c *nodeClient) Metrics(ctx context.Context, id string) (sandbox.Metric, error) {
	var m sandbox.Metric
	err := c.call(ctx, "Metrics", rpcArgs{ID: id}, &m)
	return m, err
}

func (c *nodeClient) SetTimeout(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "SetTimeout", rpcArgs{ID: id, D: d})
}

func (c *nodeClient) Extend(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "Extend", rpcArgs{ID: id, D: d})
}

func (c *nodeClient) SetNetwork(ctx context.Context, id string, n sandbox.Network) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "SetNetwork", rpcArgs{ID: id, Network: &n})
}

func (c *nodeClient) Pause(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "Pause", rpcArgs{ID: id})
}

func (c *nodeClient) PauseFiles(ctx context.Context, id string) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "PauseFiles", rpcArgs{ID: id})
}

func (c *nodeClient) Resume(ctx context.Context, id string, d time.Duration) (sandbox.Sandbox, error) {
	return c.sandbox(ctx, "Resume", rpcArgs{ID: id, D: d})
}

func (c *nodeClient) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (snapshot.Snapshot, error) {
	var sn snapshot.Snapshot
	err := c.call(ctx, "Snapshot", rpcArgs{ID: id, Snapshot: &req}, &sn)
	return sn, err
}

func (c *nodeClient) Fork(ctx context.Context, id string, count int, d time.Duration, metadata map[string]string) ([]sandbox.ForkResult, error) {
	var wire []forkResult
	if err := c.call(ctx, "Fork", rpcArgs{ID: id, Count: count, D: d, Metadata: metadata}, &wire); err != nil {
		return nil, err
	}
	out := make([]sandbox.ForkResult, len(wire))
	for i, fr := range wire {
		out[i] = sandbox.ForkResult{Sandbox: fr.Sandbox, Err: fr.Err.err()}
	}
	return out, nil
}

func (c *nodeClient) ListSnapshots(ctx context.Context, sandboxID string) ([]snapshot.Snapshot, error) {
	var out []snapshot.Snapshot
	err := c.call(ctx, "ListSnapshots", rpcArgs{ID: sandboxID}, &out)
	return out, err
}

func (c *nodeClient) GetSnapshot(ctx context.Context, id string) (snapshot.Snapshot, error) {
	var sn snapshot.Snapshot
	err := c.call(ctx, "GetSnapshot", rpcArgs{ID: id}, &sn)
	return sn, err
}

func (c *nodeClient) DeleteSnapshot(ctx context.Context, id string) error {
	return c.call(ctx, "DeleteSnapshot", rpcArgs{ID: id}, nil)
}

func (c *nodeClient) ListTemplates(ctx context.Context) ([]api.TemplateInfo, error) {
	var out []api.TemplateInfo
	err := c.call(ctx, "ListTemplates", rpcArgs{}, &out)
	return out, err
}

func (c *nodeClient) GetTemplate(ctx context.Context, name string) (api.TemplateInfo, error) {
	var t api.TemplateInfo
	err := c.call(ctx, "GetTemplate", rpcArgs{Name: name}, &t)
	return t, err
}

func (c *nodeClient) DeleteTemplate(ctx context.Context, name string) error {
	return c.call(ctx, "DeleteTemplate", rpcArgs{Name: name}, nil)
}

func (c *nodeClient) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (api.TemplateInfo, error) {
	hdr, err := json.Marshal(req)
	if err != nil {
		return api.TemplateInfo{}, err
	}
	var body io.Reader = http.NoBody
	if req.Upload != nil {
		body = req.Upload
	}
	u, err := c.url("build")
	if err != nil {
		return api.TemplateInfo{}, err
	}
	ctx, cancel := c.bound(ctx, "build")
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, u, body)
	if err != nil {
		return api.TemplateInfo{}, err
	}
	c.auth.sign(r)
	r.Header.Set("X-Agentenv-Build", base64.StdEncoding.EncodeToString(hdr))
	if req.Upload != nil {
		r.Header.Set("X-Agentenv-Upload", "1")
	}
	// A build takes minutes: no client timeout beyond ctx.
	resp, err := c.http.Do(r)
	if err != nil {
		return api.TemplateInfo{}, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return api.TemplateInfo{}, readWireError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev buildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		switch {
		case ev.Error != nil:
			return api.TemplateInfo{}, ev.Error.err()
		case ev.Template != nil:
			return *ev.Template, nil
		case ev.Progress != nil:
			progress(*ev.Progress)
		}
	}
	return api.TemplateInfo{}, c.unreachable(fmt.Errorf("build stream ended without a result: %v", sc.Err()))
}
