package router

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/nodepb/nodepbconnect"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// nodeClient calls one node: the generated client, its calls bounded
// and their errors classed by intercept.
type nodeClient struct {
	name, addr string
	// err, if set, refuses every call before it is made (a node that
	// may not be reached as registered).
	err  error
	base string
	auth secret.Auth
	http *http.Client
	// gone, if set, returns a channel closed when the node is lost: calls
	// to it end.
	gone func() <-chan struct{}
	rpc  nodepbconnect.NodeServiceClient
}

func newNodeClient(n store.NodeRecord, needTLS bool, auth secret.Auth, hc *http.Client, gone func() <-chan struct{}) *nodeClient {
	c := &nodeClient{name: n.Name, addr: n.Addr, auth: auth, http: hc, gone: gone}
	c.base, c.err = n.BaseURL(needTLS)
	signed := &http.Client{Transport: signer{auth: auth, next: hc.Transport}}
	c.rpc = nodepbconnect.NewNodeServiceClient(signed, c.base, connect.WithInterceptors(connect.UnaryInterceptorFunc(c.intercept)))
	return c
}

// signer signs each request with the cluster secret.
type signer struct {
	auth secret.Auth
	next http.RoundTripper
}

func (s signer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if err := s.auth.Sign(r); err != nil {
		return nil, err
	}
	next := s.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// call makes one unary call and returns the answer's message.
func call[Req, Resp any](ctx context.Context, f func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error), req *Req) (*Resp, error) {
	resp, err := f(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
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

var slowMethods = map[string]bool{"Create": true, "Fork": true, "Snapshot": true, "Resume": true, "Connect": true, "build": true}

// bound returns ctx ended by the method's timeout and by the node's loss.
func (c *nodeClient) bound(ctx context.Context, method string) (context.Context, context.CancelFunc) {
	var cancel context.CancelFunc
	if slowMethods[method] {
		ctx, cancel = context.WithCancel(ctx)
	} else {
		ctx, cancel = context.WithTimeout(ctx, quickTimeout)
	}
	if c.gone != nil {
		gone := c.gone()
		stop := make(chan struct{})
		go func() {
			select {
			case <-gone:
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
	case <-c.gone():
		return true
	default:
		return false
	}
}

// intercept bounds a call and says what its failure means: the node's
// answer (its code), the node's loss, or a call that may or may not have
// reached it.
func (c *nodeClient) intercept(next connect.UnaryFunc) connect.UnaryFunc {
	return func(parent context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if c.err != nil {
			return nil, c.err
		}
		method := req.Spec().Procedure[strings.LastIndex(req.Spec().Procedure, "/")+1:]
		ctx, cancel := c.bound(parent, method)
		defer cancel()
		resp, err := next(ctx, req)
		if err == nil {
			return resp, nil
		}
		return nil, c.failed(parent, err)
	}
}

func (c *nodeClient) failed(parent context.Context, err error) error {
	if connect.IsWireError(err) {
		return nodepb.Unwire(err)
	}
	if c.lostDuring() {
		return fmt.Errorf("node %s was lost during the call (its lease expired): the outcome is unknown; check and retry: %w", c.name, errors.Join(errOutcomeUnknown, errdefs.ErrUnavailable))
	}
	if parent.Err() != nil {
		return parent.Err()
	}
	if isDialError(err) {
		return c.unreachable(err)
	}
	// The request may have reached the node.
	return fmt.Errorf("%w: %w", errOutcomeUnknown, c.unreachable(err))
}

func (c *nodeClient) unreachable(err error) error {
	return errdefs.Unavailable("node %s (%s) did not answer: %v; retry in a moment", c.name, c.addr, err)
}

// BuildTemplate builds on the node: the upload streamed in, its progress
// streamed back.
func (c *nodeClient) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	if c.err != nil {
		return service.TemplateInfo{}, c.err
	}
	hdr, err := json.Marshal(req)
	if err != nil {
		return service.TemplateInfo{}, err
	}
	var body io.Reader = http.NoBody
	if req.Upload != nil {
		body = req.Upload
	}
	ctx, cancel := c.bound(ctx, "build")
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+nodepb.HTTPPath+"build", body)
	if err != nil {
		return service.TemplateInfo{}, err
	}
	r.Header.Set("X-Agentenv-Build", base64.StdEncoding.EncodeToString(hdr))
	if req.Upload != nil {
		r.Header.Set("X-Agentenv-Upload", "1")
	}
	if err := c.auth.Sign(r); err != nil {
		return service.TemplateInfo{}, err
	}
	// A build takes minutes: no client timeout beyond ctx.
	resp, err := c.http.Do(r)
	if err != nil {
		return service.TemplateInfo{}, c.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return service.TemplateInfo{}, nodepb.ReadHTTPError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev nodepb.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		switch {
		case ev.Error != nil:
			return service.TemplateInfo{}, nodepb.DecodeError(ev.Error)
		case ev.Template != nil:
			return *ev.Template, nil
		case ev.Progress != nil:
			progress(*ev.Progress)
		}
	}
	return service.TemplateInfo{}, c.unreachable(fmt.Errorf("build stream ended without a result: %v", sc.Err()))
}
