package node

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/nodepb/nodepbconnect"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// The node RPC: the node service (api/node/v1/node.proto) over Connect,
// generated at both ends, so an API server runs the very same REST
// handlers against a node's sandboxes. Errors cross as Connect codes
// (nodepb.Wire/Unwire). A template build (an upload in, progress out) and
// the peer exports (byte ranges of files) stay plain HTTP streams under
// nodepb.HTTPPath, with errors in the same codes. Every request carries a proof of
// the cluster secret (secret.AuthHeader); a node answers nothing without it, and
// with mutual TLS configured nothing to a caller without a certificate of
// the fleet's CA.
// ServiceHandler serves the node service over b: the route prefix and
// its handler.
func ServiceHandler(b service.Backend) (string, http.Handler) {
	return nodepbconnect.NewNodeServiceHandler(&nodeService{b: b},
		connect.WithInterceptors(connect.UnaryInterceptorFunc(wireErrors)), connect.WithReadMaxBytes(service.MaxBody))
}

// wireErrors turns a handler's errdefs error into its Connect code.
func wireErrors(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			var ce *connect.Error
			if !errors.As(err, &ce) {
				err = nodepb.Wire(err)
			}
		}
		return resp, err
	}
}

// serveBuild runs a template build: the request in a header, the upload
// (if any) as the body, progress streamed back as NDJSON.
func serveBuild(b service.Backend, w http.ResponseWriter, r *http.Request) {
	var req template.BuildRequest
	raw, err := base64.StdEncoding.DecodeString(r.Header.Get("X-Agentenv-Build"))
	if err == nil {
		err = json.Unmarshal(raw, &req)
	}
	if err != nil {
		nodepb.WriteHTTPError(w, errdefs.Invalid("fleet build: malformed request header: %v", err))
		return
	}
	if r.Header.Get("X-Agentenv-Upload") == "1" {
		http.NewResponseController(w).EnableFullDuplex()
		req.Upload = r.Body
	}
	enc := json.NewEncoder(w)
	started := false
	emit := func(ev nodepb.BuildEvent) {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		enc.Encode(ev)
		http.NewResponseController(w).Flush()
	}
	t, err := b.BuildTemplate(r.Context(), req, func(p template.Progress) { emit(nodepb.BuildEvent{Progress: &p}) })
	switch {
	case err != nil && !started:
		nodepb.WriteHTTPError(w, err)
	case err != nil:
		emit(nodepb.BuildEvent{Error: nodepb.EncodeError(err)})
	default:
		emit(nodepb.BuildEvent{Template: &t})
	}
}
