// Package imagebuild builds templates from a list of steps, as E2B's
// template-in-code builder describes them (fromImage / fromTemplate, RUN,
// COPY, ENV, WORKDIR, USER, start and ready commands). Every RUN step runs
// inside a gVisor build sandbox, never on the host; each step writes one
// layer, cached by (parent layer, step, files hash) so an unchanged prefix
// of a build is not run again. The result is a prepared root filesystem
// tree and its process settings, which the caller turns into an ordinary
// EROFS template through the template store (template.BuildRequest.Tree).
//
// It owns the build cache, image pulls for builds and the build sandboxes.
// It does not know about HTTP, E2B's wire shapes, build records or where
// uploaded files are kept: the API layer hands it a Spec and a way to open
// a COPY step's files, and receives log entries as the build goes.
package imagebuild

import (
	"io"
	"strconv"
	"time"
)

// Spec is one build, already validated for shape by the caller.
type Spec struct {
	// Name is the template the build makes (an agentenv template name).
	Name string
	// Owner is the API key name the build is for ("": the operator). Its
	// layers are cached for it alone, and only its own or the operator's
	// imported templates stand for a fromImage reference.
	Owner string
	// Exactly one of FromImage (an image reference, pulled on the server)
	// and FromTemplate (an existing template's name) is set.
	FromImage    string
	FromTemplate string
	// Registry holds the credentials for FromImage, if any.
	Registry *RegistryAuth
	// Steps run in order, numbered from 1 in logs and errors.
	Steps []Step
	// Force rebuilds every step, ignoring the cache.
	Force bool
	// StartCmd and ReadyCmd become the template's start and ready commands.
	StartCmd string
	ReadyCmd string
	// CPUs and MemoryMB bound each build sandbox (0: the builder's
	// default) and become the template's sandboxes' defaults.
	CPUs     int
	MemoryMB int
	// Files opens the archive (tar, plain or gzip) a COPY step's FilesHash
	// names. It is not called for other steps. FilesHash is what the cache
	// is keyed by, so it must name the archive's bytes as the server
	// hashed them, not a hash a client claims.
	Files func(hash string) (io.ReadCloser, error)
}

// Step is one instruction: Type is RUN, COPY, ENV, WORKDIR or USER (E2B's
// spelling); Args as E2B's SDKs send them:
//   - RUN: [command, user?]
//   - COPY: [src, dest, owner?, mode?] plus FilesHash
//   - ENV: [key1, value1, key2, value2, ...]
//   - WORKDIR: [path]; USER: [user]
type Step struct {
	Type      string
	Args      []string
	FilesHash string
	// Force runs this step (and so every later one) even if cached.
	Force bool
}

// RegistryAuth are credentials for pulling FromImage.
type RegistryAuth struct {
	Username string
	Password string
}

// LogEntry is one line of a build's log. Step is "base", a step number
// ("1", "2", ...) or "finalize"; empty for lines about the whole build.
type LogEntry struct {
	Time    time.Time
	Level   string // debug, info, warn or error
	Message string
	Step    string
}

// StepError is a failed step: its number, what it ran, and the tail of
// its output. Its Error text names all three.
type StepError struct {
	Step    int
	Type    string
	Command string
	Output  string
	Err     error
}

func (e *StepError) Error() string {
	msg := "step " + strconv.Itoa(e.Step) + " (" + e.Type + " " + e.Command + ") failed: " + e.Err.Error()
	if e.Output != "" {
		msg += "; output tail:\n" + e.Output
	}
	return msg
}

func (e *StepError) Unwrap() error { return e.Err }
