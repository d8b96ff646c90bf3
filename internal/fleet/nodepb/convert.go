// Package nodepb is the wire of the node service (api/node/v1/node.proto):
// its generated messages and Connect code, their conversions to and from
// the node's own types, the error ↔ code map, and the node's plain HTTP
// streams (build, peer exports). It must not decide anything: the node
// and router packages do.
package nodepb

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/snapshot"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/volume"
)

// Conversions between the node service's messages and the node's own
// types: each boundary has its message, and only here do they meet.

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func fromTS(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func dur(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// Dur is a Duration as a time.Duration (0 when unset).
func Dur(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.AsDuration()
}

// D is d as a Duration message (unset for 0).
func D(d time.Duration) *durationpb.Duration { return dur(d) }

// FromNetwork converts an egress policy.
func FromNetwork(n sandbox.Network) *Network {
	return &Network{AllowInternet: n.AllowInternet, AllowOut: n.AllowOut, DenyOut: n.DenyOut, PrivateTraffic: n.PrivateTraffic}
}

// ToNetwork converts an egress policy (the zero policy for nil).
func ToNetwork(n *Network) sandbox.Network {
	return sandbox.Network{AllowInternet: n.GetAllowInternet(), AllowOut: n.GetAllowOut(), DenyOut: n.GetDenyOut(), PrivateTraffic: n.GetPrivateTraffic()}
}

func fromLifecycle(l sandbox.Lifecycle) *Lifecycle {
	return &Lifecycle{AutoPause: l.AutoPause, DropMemory: l.DropMemory, AutoResume: l.AutoResume}
}

func toLifecycle(l *Lifecycle) sandbox.Lifecycle {
	return sandbox.Lifecycle{AutoPause: l.GetAutoPause(), DropMemory: l.GetDropMemory(), AutoResume: l.GetAutoResume()}
}

// FromSandbox is a sandbox as its node answers with it (no slot).
func FromSandbox(sb sandbox.Sandbox) *Sandbox {
	return &Sandbox{
		Id: sb.ID, Template: sb.Template, State: string(sb.State), Metadata: sb.Metadata, EnvVars: sb.EnvVars,
		Cpus: int32(sb.CPUs), MemoryMb: int32(sb.MemoryMB), Nproc: sb.Nproc, DiskMb: int32(sb.DiskMB),
		StartedAt: ts(sb.StartedAt), EndAt: ts(sb.EndAt), AccessToken: sb.AccessToken, TrafficToken: sb.TrafficToken,
		Snapshot: sb.Snapshot, Parent: sb.Parent, Remaining: dur(sb.Remaining), Network: FromNetwork(sb.Network),
		Reason: sb.Reason, Timeout: dur(sb.Timeout), Lifecycle: fromLifecycle(sb.Lifecycle), Owner: sb.Owner,
		Volumes: fromMounts(sb.Volumes),
	}
}

// ToSandbox is the caller's view of a sandbox its node sent.
func ToSandbox(p *Sandbox) sandbox.Sandbox {
	return sandbox.Sandbox{
		ID: p.GetId(), Template: p.GetTemplate(), State: sandbox.State(p.GetState()), Metadata: p.GetMetadata(), EnvVars: p.GetEnvVars(),
		CPUs: int(p.GetCpus()), MemoryMB: int(p.GetMemoryMb()), Nproc: p.GetNproc(), DiskMB: int(p.GetDiskMb()),
		StartedAt: fromTS(p.GetStartedAt()), EndAt: fromTS(p.GetEndAt()), AccessToken: p.GetAccessToken(), TrafficToken: p.GetTrafficToken(),
		Snapshot: p.GetSnapshot(), Parent: p.GetParent(), Remaining: Dur(p.GetRemaining()), Network: ToNetwork(p.GetNetwork()),
		Reason: p.GetReason(), Timeout: Dur(p.GetTimeout()), Lifecycle: toLifecycle(p.GetLifecycle()), Owner: p.GetOwner(),
		Volumes: toMounts(p.GetVolumes()),
	}
}

// fromMounts converts volume mounts without their host directories,
// which never cross the wire (the volume's node finds its own).
func fromMounts(ms []volume.Mount) []*VolumeMount {
	var out []*VolumeMount
	for _, m := range ms {
		out = append(out, &VolumeMount{Id: m.ID, Name: m.Name, Path: m.Path})
	}
	return out
}

func toMounts(ps []*VolumeMount) []volume.Mount {
	var out []volume.Mount
	for _, p := range ps {
		out = append(out, volume.Mount{ID: p.GetId(), Name: p.GetName(), Path: p.GetPath()})
	}
	return out
}

// FromVolume converts a volume and its content token.
func FromVolume(v service.VolumeInfo) *VolumeResponse {
	return &VolumeResponse{Token: v.Token, Volume: &Volume{Id: v.ID, Name: v.Name, Owner: v.Owner, CreatedAt: ts(v.Created)}}
}

// ToVolume converts a volume and its content token.
func ToVolume(p *VolumeResponse) service.VolumeInfo {
	v := p.GetVolume()
	return service.VolumeInfo{Token: p.GetToken(), Volume: volume.Volume{ID: v.GetId(), Name: v.GetName(), Owner: v.GetOwner(), Created: fromTS(v.GetCreatedAt())}}
}

// ToSandboxes converts a list.
func ToSandboxes(ps []*Sandbox) []sandbox.Sandbox {
	out := make([]sandbox.Sandbox, len(ps))
	for i, p := range ps {
		out[i] = ToSandbox(p)
	}
	return out
}

// FromCreate converts a create request.
func FromCreate(r sandbox.CreateRequest) *CreateRequest {
	out := &CreateRequest{
		Template: r.Template, Timeout: dur(r.Timeout), Metadata: r.Metadata, EnvVars: r.EnvVars,
		Cpus: int32(r.CPUs), MemoryMb: int32(r.MemoryMB), Lifecycle: fromLifecycle(r.Lifecycle), Owner: r.Owner,
		Volumes: fromMounts(r.Volumes),
	}
	if r.Network != nil {
		out.Network = FromNetwork(*r.Network)
	}
	return out
}

// ToCreate converts a create request.
func ToCreate(p *CreateRequest) sandbox.CreateRequest {
	out := sandbox.CreateRequest{
		Template: p.GetTemplate(), Timeout: Dur(p.GetTimeout()), Metadata: p.GetMetadata(), EnvVars: p.GetEnvVars(),
		CPUs: int(p.GetCpus()), MemoryMB: int(p.GetMemoryMb()), Lifecycle: toLifecycle(p.GetLifecycle()), Owner: p.GetOwner(),
		Volumes: toMounts(p.GetVolumes()),
	}
	if p.GetNetwork() != nil {
		n := ToNetwork(p.GetNetwork())
		out.Network = &n
	}
	return out
}

// FromFilter converts a list filter.
func FromFilter(f sandbox.Filter) *ListRequest {
	out := &ListRequest{Metadata: f.Metadata, Template: f.Template, StartedAfter: ts(f.StartedAfter), Owner: f.Owner}
	for _, s := range f.States {
		out.States = append(out.States, string(s))
	}
	return out
}

// ToFilter converts a list filter.
func ToFilter(p *ListRequest) sandbox.Filter {
	out := sandbox.Filter{Metadata: p.GetMetadata(), Template: p.GetTemplate(), StartedAfter: fromTS(p.GetStartedAfter()), Owner: p.GetOwner()}
	for _, s := range p.GetStates() {
		out.States = append(out.States, sandbox.State(s))
	}
	return out
}

// FromMetric converts a resource sample.
func FromMetric(m sandbox.Metric) *MetricResponse {
	return &MetricResponse{Timestamp: ts(m.Timestamp), CpuCount: int32(m.CPUCount), CpuUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}

// ToMetric converts a resource sample.
func ToMetric(p *MetricResponse) sandbox.Metric {
	return sandbox.Metric{Timestamp: fromTS(p.GetTimestamp()), CPUCount: int(p.GetCpuCount()), CPUUsedPct: p.GetCpuUsedPct(),
		MemUsed: p.GetMemUsed(), MemTotal: p.GetMemTotal(), MemCache: p.GetMemCache(), DiskUsed: p.GetDiskUsed(), DiskTotal: p.GetDiskTotal()}
}

// FromSnapshot is a snapshot as API servers see it: its file layout (the
// peer copy's business) and access token stay on the node.
func FromSnapshot(sn snapshot.Snapshot) *Snapshot {
	return &Snapshot{
		Id: sn.ID, Name: sn.Name, Metadata: sn.Metadata, Template: sn.Template, Parent: sn.Parent, Sandbox: sn.Sandbox,
		Runtime: sn.Runtime, Size: sn.Size, CreatedAt: ts(sn.CreatedAt), Internal: sn.Internal, Owner: sn.Owner,
		Cpus: int32(sn.CPUs), MemoryMb: int32(sn.MemoryMB), Nproc: sn.Nproc, DiskMb: int32(sn.DiskMB), Stored: sn.Stored, InUse: int32(sn.InUse),
		Volumes: fromMounts(sn.Volumes),
	}
}

// ToSnapshot converts a snapshot's description.
func ToSnapshot(p *Snapshot) snapshot.Snapshot {
	return snapshot.Snapshot{
		ID: p.GetId(), Name: p.GetName(), Metadata: p.GetMetadata(), Template: p.GetTemplate(), Parent: p.GetParent(), Sandbox: p.GetSandbox(),
		Runtime: p.GetRuntime(), Size: p.GetSize(), CreatedAt: fromTS(p.GetCreatedAt()), Internal: p.GetInternal(), Owner: p.GetOwner(),
		CPUs: int(p.GetCpus()), MemoryMB: int(p.GetMemoryMb()), Nproc: p.GetNproc(), DiskMB: int(p.GetDiskMb()), Stored: p.GetStored(), InUse: int(p.GetInUse()),
		Volumes: toMounts(p.GetVolumes()),
	}
}

// ToSnapshots converts a list.
func ToSnapshots(ps []*Snapshot) []snapshot.Snapshot {
	out := make([]snapshot.Snapshot, len(ps))
	for i, p := range ps {
		out[i] = ToSnapshot(p)
	}
	return out
}

// FromTemplate converts a template and its readiness.
func FromTemplate(t service.TemplateInfo) *Template {
	return &Template{
		Name: t.Name, Source: t.Source, Packages: t.Packages, CreatedAt: ts(t.CreatedAt), ImageSize: t.ImageSize, EnvdHash: t.EnvdHash,
		Env: t.Env, Workdir: t.Workdir, User: t.User, StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd, ReadyTimeout: int32(t.ReadyTimeout),
		DiskMb: int32(t.DiskMB), InUse: int32(t.InUse), Ready: t.Ready, Owner: t.Owner,
		CpuCount: int32(t.CPUs), MemoryMb: int32(t.MemoryMB),
		OwnBytes: t.OwnBytes, SharedBytes: t.SharedBytes, Lowers: t.Lowers,
	}
}

// ToTemplate converts a template and its readiness.
func ToTemplate(p *Template) service.TemplateInfo {
	return service.TemplateInfo{Ready: p.GetReady(), Template: template.Template{
		Name: p.GetName(), Source: p.GetSource(), Packages: p.GetPackages(), CreatedAt: fromTS(p.GetCreatedAt()), ImageSize: p.GetImageSize(),
		EnvdHash: p.GetEnvdHash(), Defaults: template.Defaults{Env: p.GetEnv(), Workdir: p.GetWorkdir(), User: p.GetUser()},
		Start:  template.Start{StartCmd: p.GetStartCmd(), ReadyCmd: p.GetReadyCmd(), ReadyTimeout: int(p.GetReadyTimeout())},
		DiskMB: int(p.GetDiskMb()), InUse: int(p.GetInUse()), Owner: p.GetOwner(),
		Size:     template.Size{CPUs: int(p.GetCpuCount()), MemoryMB: int(p.GetMemoryMb())},
		OwnBytes: p.GetOwnBytes(), SharedBytes: p.GetSharedBytes(), Lowers: p.GetLowers(),
	}}
}

// ToTemplates converts a list.
func ToTemplates(ps []*Template) []service.TemplateInfo {
	out := make([]service.TemplateInfo, len(ps))
	for i, p := range ps {
		out[i] = ToTemplate(p)
	}
	return out
}
