package api

import "time"

// The bodies of E2B's template-in-code build routes, as E2B's SDKs (JS
// 2.51.0) send and read them: POST /v3/templates, the file-upload
// handshake, POST /v2/templates/{id}/builds/{buildID}, the build status,
// aliases and tags.

// TemplateBuildRequestV3 is the body of POST /v3/templates.
type TemplateBuildRequestV3 struct {
	// Name is "alias" or "alias:tag"; the alias is the template's name.
	Name string `json:"name,omitempty"`
	// Alias is the deprecated spelling of Name.
	Alias string `json:"alias,omitempty"`
	// TeamID is accepted and ignored (E2B's teams).
	TeamID string `json:"teamID,omitempty"`
	// Tags the build gets (default ["default"], plus Name's tag).
	Tags []string `json:"tags,omitempty"`
	// CPUCount and MemoryMB bound each build sandbox (0: the server's
	// default) and become the template's sandboxes' defaults, as on E2B.
	CPUCount int `json:"cpuCount,omitempty"`
	MemoryMB int `json:"memoryMB,omitempty"`
	// MinFreeDiskMB is accepted and ignored.
	MinFreeDiskMB int `json:"minFreeDiskMb,omitempty"`
}

// TemplateRequestResponseV3 answers POST /v3/templates.
type TemplateRequestResponseV3 struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Aliases    []string `json:"aliases"`
}

// TemplateBuildFileUpload answers GET /templates/{id}/files/{hash}: whether
// the archive of that hash is stored for the template, and where to PUT it.
type TemplateBuildFileUpload struct {
	Present bool `json:"present"`
	// URL is absolute and carries its own signed token (no API key).
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// TemplateBuildStartV2 is the body of POST /v2/templates/{id}/builds/{buildID}.
// Exactly one of FromImage and FromTemplate is set.
type TemplateBuildStartV2 struct {
	FromImage         string             `json:"fromImage,omitempty"`
	FromTemplate      string             `json:"fromTemplate,omitempty"`
	FromImageRegistry *FromImageRegistry `json:"fromImageRegistry,omitempty"`
	// Force rebuilds every step.
	Force    bool           `json:"force,omitempty"`
	Steps    []TemplateStep `json:"steps,omitempty"`
	StartCmd string         `json:"startCmd,omitempty"`
	ReadyCmd string         `json:"readyCmd,omitempty"`
}

// FromImageRegistry are the credentials for FromImage. Only type
// "registry" (username and password) is served here.
type FromImageRegistry struct {
	Type     string `json:"type"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// AWS and GCP credentials are refused (not supported here).
	AWSAccessKeyID     string `json:"awsAccessKeyId,omitempty"`
	AWSSecretAccessKey string `json:"awsSecretAccessKey,omitempty"`
	AWSRegion          string `json:"awsRegion,omitempty"`
	ServiceAccountJSON string `json:"serviceAccountJson,omitempty"`
}

// TemplateStep is one instruction: RUN, COPY, ENV, WORKDIR or USER.
type TemplateStep struct {
	Type string   `json:"type"`
	Args []string `json:"args,omitempty"`
	// FilesHash names the uploaded archive of a COPY step.
	FilesHash string `json:"filesHash,omitempty"`
	Force     bool   `json:"force,omitempty"`
}

// TemplateBuildInfo answers GET /templates/{id}/builds/{buildID}/status.
type TemplateBuildInfo struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	// Status is waiting, building, ready or error.
	Status string `json:"status"`
	// LogEntries are the build's log from logsOffset on (at most limit).
	LogEntries []BuildLogEntry `json:"logEntries"`
	// Logs is deprecated and always empty.
	Logs   []string           `json:"logs"`
	Reason *BuildStatusReason `json:"reason,omitempty"`
}

// BuildLogEntry is one line of a build's log.
type BuildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	// Level is debug, info, warn or error.
	Level   string `json:"level"`
	Message string `json:"message"`
	// Step is "base", a step number from 1, or "finalize".
	Step string `json:"step,omitempty"`
}

// BuildStatusReason says why a build failed.
type BuildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []BuildLogEntry `json:"logEntries,omitempty"`
}

// TemplateAliasResponse answers GET /templates/aliases/{alias}.
type TemplateAliasResponse struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// AssignTemplateTagsRequest is the body of POST /templates/tags.
type AssignTemplateTagsRequest struct {
	// Target is "name:tag" (or "name": its default tag).
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// AssignedTemplateTags answers POST /templates/tags.
type AssignedTemplateTags struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// DeleteTemplateTagsRequest is the body of DELETE /templates/tags.
type DeleteTemplateTagsRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// TemplateTag is one tag of a template (GET /templates/{id}/tags).
type TemplateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// TemplateBuildLogsResponse answers GET /templates/{id}/builds/{buildID}/logs.
type TemplateBuildLogsResponse struct {
	Logs []BuildLogEntry `json:"logs"`
}
