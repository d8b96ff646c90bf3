package client

import "github.com/agentenv/agentenv/client/api"

// The API's bodies that this package's methods take and return. They are
// the api package's types under the names a client reads best, so that
// one import is enough; the server writes and reads the same types.
type (
	// Sandbox is a sandbox as the API shows it.
	Sandbox = api.Sandbox
	// BootRecord and BootStep say where a sandbox's last boot spent its time.
	BootRecord = api.BootRecord
	BootStep   = api.BootStep
	// VolumeMount mounts a volume (by name) into a new sandbox.
	VolumeMount = api.VolumeMount
	// CreateRequest is the body of a create (POST /sandboxes).
	CreateRequest = api.NewSandbox
	// ConnectRequest is the body of a connect.
	ConnectRequest = api.ConnectRequest
	// Network is a sandbox's egress settings.
	Network = api.Network
	// Metric is one sample of a sandbox's resource use.
	Metric = api.SandboxMetric
	// Template is a stored template.
	Template = api.Template
	// TemplateSettings are a template's process settings.
	TemplateSettings = api.TemplateSettings
	// BuildRequest says what template to build.
	BuildRequest = api.BuildRequest
	// BuildProgress is one progress step of a build.
	BuildProgress = api.BuildProgress
	// Snapshot is a stored snapshot.
	Snapshot = api.Snapshot
	// Node is a fleet node as `agentenv api` lists it.
	Node = api.Node
	// Error is an error answered by the server (its HTTP status, class
	// and message); use errors.As to read it.
	Error = api.Error
)

// EnvdPort is the port of envd, the daemon inside every sandbox that runs
// commands and serves files; the proxy routes requests to it by the
// E2b-Sandbox-Port header. It is the server's envdapi.Port (the client
// module cannot import the server's packages; a test checks they agree).
const EnvdPort = 49983
