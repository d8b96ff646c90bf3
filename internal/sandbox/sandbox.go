// Package sandbox owns the sandbox lifecycle: create from a template on a
// runtime with a network slot, timeouts, kill, persistence of every state
// transition and recovery after a crash. It must not speak HTTP: it
// reaches envd through Envd (internal/envdclient) and sandboxes through
// the marked dialer (internal/dialer); the api and proxy packages sit on
// top of it.
package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/netns"
	"github.com/agentenv/agentenv/internal/volume"
)

// State is a sandbox's lifecycle state.
type State string

// The lifecycle: creating → running ⇄ paused (or paused-files) → killing →
// (gone). A sandbox that cannot be brought back after a restart becomes
// lost (a tombstone kept so that clients get an explanation rather than a
// bare 404).
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	// StatePausedFiles: paused without its memory (E2B's pause with
	// memory: false). Its container and network slot are gone and its
	// files wait in its directory; a resume boots it again with them.
	// E2B's API shows it as paused (E2B).
	StatePausedFiles State = "paused-files"
	// StatePooled: booted ahead of demand, not yet handed to anyone.
	StatePooled  State = "pooled"
	StateKilling State = "killing"
	StateLost    State = "lost"
)

// ErrLost marks the error about a lost sandbox (a kind of not found):
// callers that must tell a lost sandbox from a killed one test it with
// errors.Is, never by the message.
var ErrLost error = lostError{}

type lostError struct{}

func (lostError) Error() string { return errdefs.ErrNotFound.Error() }
func (lostError) Unwrap() error { return errdefs.ErrNotFound }

// stateRules is what a state allows. The table below is the one place
// that decides it; code asks through the methods under it.
type stateRules struct {
	// next lists the allowed moves of the state machine.
	next []State
	// paused: stopped by a pause, continued by a resume (E2B: paused).
	paused bool
	// container: the sandbox has its container and network slot (a
	// policy change applies at once; a snapshot or auto-resume can use
	// them).
	container bool
}

var states = map[State]stateRules{
	StateCreating:    {next: []State{StateRunning, StatePooled, StateKilling}, container: true},
	StatePooled:      {next: []State{StateRunning, StateKilling}, container: true},
	StateRunning:     {next: []State{StatePaused, StatePausedFiles, StateKilling}, container: true},
	StatePaused:      {next: []State{StateRunning, StateKilling}, paused: true, container: true},
	StatePausedFiles: {next: []State{StateRunning, StateKilling}, paused: true},
	StateKilling:     {},
	StateLost:        {},
}

func canMove(from, to State) bool {
	for _, s := range states[from].next {
		if s == to {
			return true
		}
	}
	return false
}

// Paused reports whether a sandbox in s is paused, with its memory or
// without.
func (s State) Paused() bool { return states[s].paused }

// Live reports whether a sandbox in s is one a client has: running or
// paused in either form.
func (s State) Live() bool { return s == StateRunning || s.Paused() }

// E2B is the state E2B's API shows for s: "paused" for a pause with or
// without memory.
func (s State) E2B() State {
	if s.Paused() {
		return StatePaused
	}
	return s
}

// hasContainer reports whether a sandbox in s has its container and slot.
func (s State) hasContainer() bool { return states[s].container }

// wakesOnTraffic reports whether traffic through the proxy resumes sb:
// paused with its memory and created with autoResume (never one paused
// without it: that resume reboots it, which only connect or resume do).
func (sb Sandbox) wakesOnTraffic() bool {
	return sb.State == StatePaused && sb.Lifecycle.AutoResume
}

// Sandbox is the persisted record of one sandbox.
type Sandbox struct {
	ID       string `json:"sandboxID"`
	Template string `json:"templateID"`
	// ImageID is the template image the sandbox booted from (or was
	// restored on): its snapshots record it, to restore on that image.
	ImageID string `json:"imageID,omitempty"`
	// Lowers are the template layers below that image (digests, top
	// first), as its snapshots record them.
	Lowers   []string          `json:"lowers,omitempty"`
	State    State             `json:"state"`
	Metadata map[string]string `json:"metadata,omitempty"`
	EnvVars  map[string]string `json:"envVars,omitempty"`
	CPUs     int               `json:"cpuCount"`
	MemoryMB int               `json:"memoryMB"`
	// Nproc is the process cap the sandbox started with (part of its
	// spec, so a restore of its snapshots must use the same; 0 in records
	// older than the field: Limits.Nproc).
	Nproc int64 `json:"nproc,omitempty"`
	// DiskMB is the size of the sandbox's write layer on disk (0: in
	// memory, a sandbox older than the disk layer).
	DiskMB int `json:"diskMB,omitempty"`
	// Volumes are the volumes mounted into the sandbox (fixed at its
	// create; a fork child or a restore mounts its snapshot's).
	Volumes     []volume.Mount `json:"volumes,omitempty"`
	StartedAt   time.Time      `json:"startedAt"`
	EndAt       time.Time      `json:"endAt"`
	AccessToken string         `json:"envdAccessToken"`
	// TrafficToken, when set, must accompany requests to the sandbox's
	// exposed ports (not envd) through the proxy.
	TrafficToken string     `json:"trafficAccessToken,omitempty"`
	Slot         netns.Slot `json:"slot"`
	// Snapshot is the snapshot the sandbox was restored from, if any.
	Snapshot string `json:"snapshotID,omitempty"`
	// Parent is the sandbox its memory came from: the one a restored
	// snapshot was taken of, or a fork's parent.
	Parent string `json:"parentSandboxID,omitempty"`
	// Remaining is the time left when the sandbox was paused.
	Remaining time.Duration `json:"remaining,omitempty"`
	// Network is the sandbox's egress policy.
	Network Network `json:"network"`
	// Reason says why a sandbox was lost; EndCause is the same as one of
	// the End constants (EndOOM, EndLost), for programs.
	Reason   string `json:"reason,omitempty"`
	EndCause string `json:"endCause,omitempty"`
	// Timeout is the timeout the sandbox was created with: an auto-resume
	// (and a resume with no time left) runs it again (as E2B).
	Timeout time.Duration `json:"timeout,omitempty"`
	// Lifecycle says what happens at the timeout and to traffic while paused.
	Lifecycle Lifecycle `json:"lifecycle,omitempty"`
	// Owner is the name of the API key that made the sandbox (named keys,
	// --api-keys-file); "" for the single key's and the operator's.
	Owner string `json:"owner,omitempty"`
	// Boot says where the sandbox's last boot (its create, or a resume
	// without memory) spent its time, step by step.
	Boot *BootRecord `json:"boot,omitempty"`
}

// UnmarshalJSON reads a record, including one written before
// StatePausedFiles, which said state "paused" with "filesOnly": true.
func (sb *Sandbox) UnmarshalJSON(b []byte) error {
	type record Sandbox // without this method
	var r struct {
		record
		FilesOnly bool `json:"filesOnly"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	*sb = Sandbox(r.record)
	if r.FilesOnly && sb.State == StatePaused {
		sb.State = StatePausedFiles
	}
	return nil
}

// Lifecycle is E2B's lifecycle policy (create's autoPause, autoPauseMemory
// and autoResume). The zero value is E2B's default: kill at the timeout.
type Lifecycle struct {
	// AutoPause pauses the sandbox at its timeout instead of killing it.
	AutoPause bool `json:"autoPause,omitempty"`
	// DropMemory makes that pause keep only the files (autoPauseMemory:
	// false): resuming boots the sandbox again with its files.
	DropMemory bool `json:"dropMemory,omitempty"`
	// AutoResume resumes a paused sandbox when traffic reaches it through
	// the proxy (never one paused without its memory).
	AutoResume bool `json:"autoResume,omitempty"`
}

// Network is a sandbox's egress policy, as E2B expresses it: internet on
// or off, plus lists of IPv4 addresses or CIDRs to allow or deny (allow
// wins).
type Network struct {
	AllowInternet bool     `json:"allowInternet"`
	AllowOut      []string `json:"allowOut,omitempty"`
	DenyOut       []string `json:"denyOut,omitempty"`
	// PrivateTraffic requires the sandbox's traffic token on requests to
	// its exposed ports (E2B's allowPublicTraffic: false).
	PrivateTraffic bool `json:"privateTraffic,omitempty"`
}

// CreateRequest describes a new sandbox.
type CreateRequest struct {
	// Network defaults to internet on when nil.
	Network *Network
	// pooled boots a sandbox for the hot pool (state pooled, no timer).
	pooled   bool
	Template string
	Timeout  time.Duration
	Metadata map[string]string
	EnvVars  map[string]string
	CPUs     int
	MemoryMB int
	// Lifecycle: what happens at the timeout (default: kill).
	Lifecycle Lifecycle
	// Owner names the API key the sandbox is for (see Sandbox.Owner). A
	// create from a snapshot with an Owner refuses another owner's
	// snapshot; with none, the sandbox inherits the snapshot's owner.
	Owner string
	// Volumes to mount (checked and held by the caller: see
	// volume.Store.Hold). A restore mounts its snapshot's instead.
	Volumes []volume.Mount
}

// Limits bound what a create request may ask for.
type Limits struct {
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	DefaultCPUs    int
	MaxCPUs        int
	DefaultMemMB   int
	MaxMemMB       int
	// DefaultDiskMB is the write-layer size of sandboxes whose template
	// sets none.
	DefaultDiskMB int
	MaxSandboxes  int
	// Nproc caps processes per user inside a sandbox (contains fork bombs).
	Nproc int
	// HotPool is how many booted, idle sandboxes per template wait to be
	// handed out (0: none).
	HotPool int
	// MaxFork caps the children of one fork (restored all at once); RL
	// groups of 64 continuations are the default's reason.
	MaxFork int
}

// DefaultDiskMB is the default write-layer size of a sandbox (2 GiB). The
// layer is a sparse file: only what a sandbox writes takes host disk; but
// the disk budget counts every layer at its full size (nothing else stops a
// sandbox from filling the host), so this size is also what each sandbox
// costs the budget: 2 GiB lets a host with 100 GB free hold ~45 sandboxes
// by default. More needs a larger --disk-budget (an explicit overcommit)
// or smaller layers (--disk-mb, a template's diskMB).
const DefaultDiskMB = 2 << 10

// DefaultLimits are E2B's defaults where E2B has one.
func DefaultLimits() Limits {
	return Limits{
		DefaultTimeout: 300 * time.Second,
		MaxTimeout:     24 * time.Hour,
		DefaultCPUs:    2,
		MaxCPUs:        8,
		DefaultMemMB:   512,
		MaxMemMB:       8192,
		DefaultDiskMB:  DefaultDiskMB,
		MaxSandboxes:   2000,
		Nproc:          1024,
		MaxFork:        64,
	}
}

func (l Limits) check(req *CreateRequest) error {
	if req.Template == "" {
		return errdefs.Invalid("templateID is required: name a template (see GET /templates)")
	}
	if req.Timeout < 0 {
		return errdefs.Invalid("timeout %v is negative: give seconds between 1 and %d", req.Timeout, int(l.MaxTimeout.Seconds()))
	}
	if req.Timeout == 0 {
		req.Timeout = l.DefaultTimeout
	}
	if req.Timeout > l.MaxTimeout {
		return errdefs.Invalid("timeout %v is longer than the maximum %v", req.Timeout, l.MaxTimeout)
	}
	if req.CPUs == 0 {
		req.CPUs = l.DefaultCPUs
	}
	if req.CPUs < 0 || req.CPUs > l.MaxCPUs {
		return errdefs.Invalid("cpuCount %d out of range: give 1..%d", req.CPUs, l.MaxCPUs)
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = l.DefaultMemMB
	}
	if req.MemoryMB < 64 || req.MemoryMB > l.MaxMemMB {
		return errdefs.Invalid("memoryMB %d out of range: give 64..%d", req.MemoryMB, l.MaxMemMB)
	}
	if req.Lifecycle.DropMemory && !req.Lifecycle.AutoPause {
		return errdefs.Invalid("autoPauseMemory=false only applies when autoPause is true: set autoPause, or leave autoPauseMemory out")
	}
	if req.Lifecycle.DropMemory && req.Lifecycle.AutoResume {
		return errdefs.Invalid("autoPauseMemory=false cannot be combined with autoResume: a sandbox paused without its memory reboots on resume, so it is resumed only explicitly (connect or resume)")
	}
	for k, v := range req.EnvVars {
		if strings.ContainsRune(v, 0) {
			return errdefs.Invalid("environment variable %q contains a NUL byte, which no process can receive", k)
		}
		if k == "" || len(k) > 256 {
			return errdefs.Invalid("environment variable name %q is empty or too long", k)
		}
		for _, c := range k {
			if c == '=' || c == 0 {
				return errdefs.Invalid("environment variable name %q contains '=' or NUL", k)
			}
		}
	}
	return nil
}

// hostBytesPerProcess is what one process inside gVisor costs on the host
// (its address space's systrap stub, page tables, sentry task): measured
// 528 KiB per idle busybox sleep (TestManyProcessesDoNotKillTheSandbox).
const hostBytesPerProcess = 528 << 10

// nproc is the process cap of a sandbox with memMB of memory: the
// configured cap, lowered so that the processes' host overhead alone stays
// within half the memory limit. Forks then fail with EAGAIN inside the
// sandbox before the host's memory cgroup kills it whole.
func (l Limits) nproc(memMB int) int64 {
	n := int64(l.Nproc)
	if byMem := int64(memMB) << 20 / 2 / hostBytesPerProcess; byMem < n {
		n = byMem
	}
	return max(n, 32)
}

// pids is the process cap of a sandbox record: what it started with, or
// the configured cap for records (and snapshots) older than that field.
func (l Limits) pids(nproc int64) int64 {
	if nproc > 0 {
		return nproc
	}
	return int64(l.Nproc)
}

// checkTimeout validates a new timeout for a sandbox: 0 (its timeout
// action now, as E2B's minimum) up to the maximum.
func (l Limits) checkTimeout(d time.Duration) error {
	if d < 0 || d > l.MaxTimeout {
		return errdefs.Invalid("timeout %v out of range: give seconds between 0 (end it now) and %d", d, int(l.MaxTimeout.Seconds()))
	}
	return nil
}

// newID returns a fixed-width sandbox ID (runsc matches IDs by prefix, so
// every ID has the same length).
func newID() string {
	b := make([]byte, 10)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return "i" + hex.EncodeToString(b)
}

func newToken() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}
