// Package api holds the JSON bodies of agentenv's REST API, the Go side of
// api/openapi.yaml at the repository's root: what the server's handlers write and read
// and what the client package sends and decodes are these types, and a test
// checks each against its schema in openapi.yaml. It must not hold
// behaviour: no HTTP, no server state, only shapes and their field docs.
//
// Optional request fields are pointers where absent and zero differ on the
// server (a timeout of 0 is refused, an absent one is the default); write
// them with new(int64(60)).
package api

import (
	"fmt"
	"time"
)

// Sandbox is a sandbox as create, connect, get and list return it (E2B's
// Sandbox, SandboxDetail and ListedSandbox shapes in one).
type Sandbox struct {
	SandboxID  string `json:"sandboxID"`
	TemplateID string `json:"templateID"`
	// Alias is the template's name (the same as TemplateID).
	Alias    string `json:"alias,omitempty"`
	ClientID string `json:"clientID"`
	// EnvdVersion is the version of envd inside the sandbox; E2B's SDKs
	// enable features by it.
	EnvdVersion string `json:"envdVersion"`
	// EnvdAccessToken goes to envd as X-Access-Token. Lists leave it out.
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken goes to the sandbox's ports through the proxy as
	// E2b-Traffic-Access-Token when its network has AllowPublicTraffic
	// false. Lists leave it out.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
	// Domain is what follows "<port>-<sandboxID>." to reach a sandbox port
	// through the proxy; nil when the server has none.
	Domain     *string           `json:"domain"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	CPUCount   int               `json:"cpuCount"`
	MemoryMB   int               `json:"memoryMB"`
	DiskSizeMB int               `json:"diskSizeMB"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// State is creating, running, paused or killing.
	State               string     `json:"state"`
	AllowInternetAccess bool       `json:"allowInternetAccess"`
	Network             *Network   `json:"network,omitempty"`
	Lifecycle           *Lifecycle `json:"lifecycle,omitempty"`
	// SnapshotID is the snapshot the sandbox was restored from (for a
	// fork's child: its parent's), ParentSandboxID the sandbox that
	// snapshot was taken of (a fork's parent).
	SnapshotID      string `json:"snapshotID,omitempty"`
	ParentSandboxID string `json:"parentSandboxID,omitempty"`
	// Boot (agentenv's; on create, connect and get) says where the
	// sandbox's last boot spent its time.
	Boot *BootRecord `json:"boot,omitempty"`
	// VolumeMounts are the volumes the sandbox mounts.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// BootRecord is a boot's steps in the order they ran.
type BootRecord struct {
	Kind  string     `json:"kind"`
	Steps []BootStep `json:"steps"`
}

// BootStep is one step of a boot; CPUMs is nil where the sandbox's CPU
// was not known.
type BootStep struct {
	Step   string   `json:"step"`
	WallMs float64  `json:"wallMs"`
	CPUMs  *float64 `json:"cpuMs,omitempty"`
}

// Network is E2B's egress settings of a sandbox.
type Network struct {
	// AllowOut are IPv4 addresses or CIDRs always reachable, DenyOut ones
	// never reachable (unless also allowed).
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// AllowPublicTraffic false makes requests to the sandbox's ports need
	// its TrafficAccessToken.
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
}

// Lifecycle is E2B's SandboxLifecycle.
type Lifecycle struct {
	AutoResume bool `json:"autoResume"`
	// OnTimeout is kill or pause.
	OnTimeout string `json:"onTimeout"`
}

// NewSandbox is the body of POST /sandboxes.
type NewSandbox struct {
	// TemplateID is a template's name, or a snapshot ID to restore.
	TemplateID string `json:"templateID"`
	// Timeout is the sandbox's life in seconds (absent: 300; 0 is refused).
	Timeout  *int64            `json:"timeout,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	EnvVars  map[string]string `json:"envVars,omitempty"`
	// CPUCount and MemoryMB are agentenv's (0: the template's, else the
	// server's defaults).
	CPUCount int `json:"cpuCount,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
	// AllowInternetAccess turns egress to the internet off or on (absent: on).
	AllowInternetAccess *bool    `json:"allow_internet_access,omitempty"`
	Network             *Network `json:"network,omitempty"`
	// AutoPause pauses the sandbox at its timeout instead of killing it;
	// AutoPauseMemory false (with AutoPause) keeps only its files.
	AutoPause       *bool       `json:"autoPause,omitempty"`
	AutoPauseMemory *bool       `json:"autoPauseMemory,omitempty"`
	AutoResume      *AutoResume `json:"autoResume,omitempty"`
	// VolumeMounts mounts volumes (by name) at absolute paths.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// AutoResume is E2B's autoResume setting of a new sandbox.
type AutoResume struct {
	// Enabled resumes a sandbox paused with its memory when traffic
	// reaches it through the proxy.
	Enabled bool `json:"enabled"`
}

// ConnectRequest is the body of POST /v2/sandboxes/{id}/connect.
type ConnectRequest struct {
	// Timeout makes the sandbox end at least this many seconds from now.
	Timeout *int64 `json:"timeout,omitempty"`
	// Memory false resumes a sandbox paused without its memory.
	Memory *bool `json:"memory,omitempty"`
}

// TimeoutRequest is the body of POST /sandboxes/{id}/timeout.
type TimeoutRequest struct {
	// Timeout is seconds from now until the timeout action (required).
	Timeout *int64 `json:"timeout"`
}

// PauseRequest is the body of POST /sandboxes/{id}/pause.
type PauseRequest struct {
	// Memory false keeps only the sandbox's files (absent: true).
	Memory *bool `json:"memory,omitempty"`
}

// ResumeRequest is the body of POST /sandboxes/{id}/resume.
type ResumeRequest struct {
	// Timeout is seconds from now; absent or 0 keeps the time it had left.
	Timeout *int64 `json:"timeout,omitempty"`
	// Memory false is accepted for a sandbox paused without its memory.
	Memory *bool `json:"memory,omitempty"`
}

// RefreshRequest is the body of POST /sandboxes/{id}/refreshes.
type RefreshRequest struct {
	// Duration is seconds the sandbox lives at least (absent: 60).
	Duration *int64 `json:"duration,omitempty"`
}

// NetworkUpdate is the body of PUT /sandboxes/{id}/network; fields left
// out keep their value.
type NetworkUpdate struct {
	AllowOut            *[]string `json:"allowOut,omitempty"`
	DenyOut             *[]string `json:"denyOut,omitempty"`
	AllowInternetAccess *bool     `json:"allow_internet_access,omitempty"`
}

// SandboxMetric is one sample of a sandbox's resource use (E2B's
// SandboxMetric).
type SandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// SandboxesMetrics is the answer of GET /sandboxes/metrics: a sample of
// each listed sandbox that exists, by ID.
type SandboxesMetrics struct {
	Sandboxes map[string]SandboxMetric `json:"sandboxes"`
}

// SnapshotRequest is the body of POST /sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Snapshot is a snapshot (E2B's snapshotID and names, plus agentenv's
// fields). Its SnapshotID, given as a NewSandbox's TemplateID, restores it.
type Snapshot struct {
	SnapshotID string `json:"snapshotID"`
	// Names holds Name when there is one (E2B's shape).
	Names    []string          `json:"names"`
	Name     string            `json:"name,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// TemplateID is the snapshotted sandbox's template, Parent the
	// snapshot that sandbox was restored from.
	TemplateID string `json:"templateID"`
	Parent     string `json:"parentSnapshotID,omitempty"`
	SandboxID  string `json:"sandboxID"`
	// Runtime is the runsc build that wrote it.
	Runtime   string `json:"runtimeVersion"`
	SizeBytes int64  `json:"sizeBytes"`
	// StoredBytes is what the snapshot added to the node's store when it
	// was taken (pages its sandbox's previous snapshot lacked).
	StoredBytes int64     `json:"storedBytes"`
	CreatedAt   time.Time `json:"createdAt"`
	// InUse counts running sandboxes restored from it.
	InUse int `json:"sandboxesInUse"`
}

// ForkRequest is the body of POST /sandboxes/{id}/fork.
type ForkRequest struct {
	// Count is the number of children (absent: 1).
	Count *int `json:"count,omitempty"`
	// Timeout is each child's life in seconds (absent: 300).
	Timeout *int64 `json:"timeout,omitempty"`
	// Metadata of the children (absent: the parent's).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// ForkResult is one child of a fork; exactly one field is set.
type ForkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *Error   `json:"error,omitempty"`
}

// TemplateSettings are a template's process settings: defaults for every
// process in its sandboxes (an OCI image's env, workdir and user) and a
// start command running in every sandbox once its ready check passes.
type TemplateSettings struct {
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	User     string            `json:"user,omitempty"`
	StartCmd string            `json:"startCmd,omitempty"`
	ReadyCmd string            `json:"readyCmd,omitempty"`
	// ReadyTimeout bounds the wait for ReadyCmd in seconds (0: 60).
	ReadyTimeout int `json:"readyTimeout,omitempty"`
}

// Template is a stored template (E2B's Template shape plus agentenv's
// fields).
type Template struct {
	TemplateID string    `json:"templateID"`
	BuildID    string    `json:"buildID"`
	Aliases    []string  `json:"aliases"`
	Public     bool      `json:"public"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// Source says what it was built from: busybox, debian:bookworm,
	// rootfs:/path, oci:IMAGE.
	Source    string   `json:"source"`
	Packages  []string `json:"packages,omitempty"`
	ImageSize int64    `json:"imageSizeBytes"`
	// OwnBytes is the disk the template's own files take; SharedBytes
	// that of the layers below its image, shared with every template
	// built on the same base and counted once by the server's quota.
	OwnBytes    int64 `json:"ownBytes"`
	SharedBytes int64 `json:"sharedBytes"`
	// Layers counts the read-only layers the template stacks (1: flat).
	Layers int `json:"layers,omitempty"`
	// DiskSizeMB is the template's own write-layer size (0: the server's).
	DiskSizeMB int `json:"diskSizeMB,omitempty"`
	// InUse counts sandboxes started from it.
	InUse int `json:"sandboxesInUse"`
	// Ready: creates restore a snapshot of the booted template.
	Ready bool `json:"ready"`
	TemplateSettings
}

// BuildRequest is the body of POST /agentenv/templates. Exactly one source
// is set: Debian, Rootfs or Busybox.
type BuildRequest struct {
	Name     string   `json:"name"`
	Debian   string   `json:"debian,omitempty"`
	Packages []string `json:"packages,omitempty"`
	// Mirror is refused: the Debian mirror is the operator's choice.
	Mirror string `json:"mirror,omitempty"`
	// Rootfs is a directory or tarball inside the server's --import-dir.
	Rootfs string `json:"rootfs,omitempty"`
	// Busybox builds the tiny busybox template.
	Busybox bool `json:"busybox,omitempty"`
	// Image labels an uploaded rootfs flattened from an OCI image (a
	// query parameter of the upload route, not a field of this body).
	Image string `json:"-"`
	TemplateSettings
	// DiskMB is the write-layer size of the template's sandboxes (0: the
	// server's default).
	DiskMB int `json:"diskMB,omitempty"`
	// CPUCount and MemoryMB are the template's sandboxes' defaults (0: the
	// server's), as a template-in-code build's.
	CPUCount int `json:"cpuCount,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
	// CodeInterpreter installs the code interpreter server (E2B's
	// /execute API on port 49999) as the template's start command; the
	// packages must bring python3 with ipykernel.
	CodeInterpreter bool `json:"codeInterpreter,omitempty"`
}

// BuildProgress is one progress step of a build.
type BuildProgress struct {
	Phase   string  `json:"phase"`
	Percent float64 `json:"percent"`
	Message string  `json:"message,omitempty"`
}

// BuildEvent is one line of a build's NDJSON stream: progress lines, then
// one line with either the template or an error.
type BuildEvent struct {
	Progress *BuildProgress `json:"progress,omitempty"`
	Template *Template      `json:"template,omitempty"`
	Error    *Error         `json:"error,omitempty"`
}

// Node is a fleet node as `agentenv api` lists it (GET /agentenv/nodes).
type Node struct {
	Name      string       `json:"name"`
	Addr      string       `json:"addr"`
	Runtime   string       `json:"runtime,omitempty"`
	StartedAt time.Time    `json:"startedAt"`
	Alive     bool         `json:"alive"`
	Cordoned  bool         `json:"cordoned"`
	Draining  bool         `json:"draining"`
	LostAt    time.Time    `json:"lostAt"`
	Sandboxes int          `json:"sandboxes"`
	Capacity  NodeCapacity `json:"capacity"`
}

// NodeCapacity is what a fleet node offers and holds.
type NodeCapacity struct {
	CPUs         int   `json:"cpus"`
	MemoryMB     int64 `json:"memoryMB"`
	FreeMemoryMB int64 `json:"freeMemoryMB"`
	MaxSandboxes int   `json:"maxSandboxes"`
	Sandboxes    int   `json:"sandboxes"`
	Templates    int   `json:"templates"`
	Snapshots    int   `json:"snapshots"`
}

// Error is the error body of every REST route.
type Error struct {
	// Status is the HTTP status, repeated (E2B's SDKs read it).
	Status int `json:"code"`
	// ErrorCode is the error class: invalid_argument, not_found,
	// conflict, unavailable, ...
	ErrorCode string `json:"error_code"`
	// Message says what went wrong and, where possible, what to do.
	Message string `json:"message"`
	// EndCause, on a 404 for a sandbox that ended, says why, for
	// programs: killed, timeout, oom or lost (agentenv's; E2B's
	// SDKs ignore it). Empty when the server does not remember.
	EndCause string `json:"end_cause,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// VolumeMount is a volume mounted into a sandbox, by the volume's name.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Volume is a volume as GET /volumes lists it.
type Volume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

// VolumeAndToken is a volume with the bearer token of its content API
// (/volumecontent), as create and get answer.
type VolumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
	// Domain is the server's --domain, if it has one.
	Domain string `json:"domain,omitempty"`
}

// NewVolume is the body of POST /volumes.
type NewVolume struct {
	Name string `json:"name"`
}

// VolumeEntryStat describes a file or directory of a volume.
type VolumeEntryStat struct {
	Name string `json:"name"`
	// Type is file, directory, symlink or unknown.
	Type string `json:"type"`
	// Path is absolute, inside the volume.
	Path  string    `json:"path"`
	Size  int64     `json:"size"`
	Mode  uint32    `json:"mode"`
	UID   uint32    `json:"uid"`
	GID   uint32    `json:"gid"`
	Atime time.Time `json:"atime"`
	Mtime time.Time `json:"mtime"`
	Ctime time.Time `json:"ctime"`
	// Target is a symbolic link's target.
	Target string `json:"target,omitempty"`
}

// VolumeMetadata is the body of PATCH /volumecontent/{id}/path.
type VolumeMetadata struct {
	UID  *uint32 `json:"uid,omitempty"`
	GID  *uint32 `json:"gid,omitempty"`
	Mode *uint32 `json:"mode,omitempty"`
}
