package nodepb

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"time"

	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// HTTPPath prefixes a node's plain HTTP routes: the template build stream
// and the exports peers copy templates and snapshots from.
const HTTPPath = "/fleet/v1/"

// BuildEvent is one line of a streamed build.
type BuildEvent struct {
	Progress *template.Progress    `json:"progress,omitempty"`
	Template *service.TemplateInfo `json:"template,omitempty"`
	Error    json.RawMessage       `json:"error,omitempty"`
}

// NewTransport is the HTTP transport API servers (and nodes copying from
// peers) use to reach nodes; tlsConf verifies nodes that serve TLS.
func NewTransport(tlsConf *tls.Config) *http.Transport {
	return &http.Transport{
		TLSClientConfig:     tlsConf,
		DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}
