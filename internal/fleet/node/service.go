package node

import (
	"context"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/nodepb/nodepbconnect"
	"github.com/agentenv/agentenv/internal/sandbox"
	"github.com/agentenv/agentenv/internal/service"
)

// nodeService is the node service over a node's service.Backend. Its methods
// are also the generated client's (containerd's local-service pattern):
// a caller holding a NodeServiceClient cannot tell this node's own
// service from a remote one's.
type nodeService struct{ b service.Backend }

var (
	_ nodepbconnect.NodeServiceHandler = (*nodeService)(nil)
	_ nodepbconnect.NodeServiceClient  = (*nodeService)(nil)
)

type (
	req[T any]  = connect.Request[T]
	resp[T any] = connect.Response[T]
)

func answer[T any](m *T, err error) (*resp[T], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(m), nil
}

func sandboxAnswer(sb sandbox.Sandbox, err error) (*resp[nodepb.SandboxResponse], error) {
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&nodepb.SandboxResponse{Sandbox: nodepb.FromSandbox(sb)}), nil
}

func (s *nodeService) Create(ctx context.Context, r *req[nodepb.CreateRequest]) (*resp[nodepb.SandboxResponse], error) {
	return sandboxAnswer(s.b.Create(ctx, nodepb.ToCreate(r.Msg)))
}

func (s *nodeService) List(ctx context.Context, r *req[nodepb.ListRequest]) (*resp[nodepb.ListResponse], error) {
	list, err := s.b.List(ctx, nodepb.ToFilter(r.Msg))
	out := &nodepb.ListResponse{}
	for _, sb := range list {
		out.Sandboxes = append(out.Sandboxes, nodepb.FromSandbox(sb))
	}
	return answer(out, err)
}

func (s *nodeService) Get(ctx context.Context, r *req[nodepb.SandboxRef]) (*resp[nodepb.SandboxResponse], error) {
	return sandboxAnswer(s.b.Get(ctx, r.Msg.GetId()))
}

func (s *nodeService) Kill(ctx context.Context, r *req[nodepb.SandboxRef]) (*resp[nodepb.Empty], error) {
	return answer(&nodepb.Empty{}, s.b.Kill(ctx, r.Msg.GetId()))
}

func (s *nodeService) Metrics(ctx context.Context, r *req[nodepb.SandboxRef]) (*resp[nodepb.MetricResponse], error) {
	m, err := s.b.Metrics(ctx, r.Msg.GetId())
	return answer(nodepb.FromMetric(m), err)
}

func (s *nodeService) SetTimeout(ctx context.Context, r *req[nodepb.TimeoutRequest]) (*resp[nodepb.SandboxResponse], error) {
	return sandboxAnswer(s.b.SetTimeout(ctx, r.Msg.GetId(), nodepb.Dur(r.Msg.GetTimeout())))
}

func (s *nodeService) Extend(ctx context.Context, r *req[nodepb.TimeoutRequest]) (*resp[nodepb.SandboxResponse], error) {
	return sandboxAnswer(s.b.Extend(ctx, r.Msg.GetId(), nodepb.Dur(r.Msg.GetTimeout())))
}

func (s *nodeService) SetNetwork(ctx context.Context, r *req[nodepb.SetNetworkRequest]) (*resp[nodepb.SandboxResponse], error) {
	if r.Msg.GetNetwork() == nil {
		return nil, errdefs.Invalid("SetNetwork needs a network")
	}
	return sandboxAnswer(s.b.SetNetwork(ctx, r.Msg.GetId(), nodepb.ToNetwork(r.Msg.GetNetwork())))
}

func (s *nodeService) Pause(ctx context.Context, r *req[nodepb.PauseRequest]) (*resp[nodepb.SandboxResponse], error) {
	if !r.Msg.GetFilesOnly() {
		return sandboxAnswer(s.b.Pause(ctx, r.Msg.GetId()))
	}
	fp, ok := s.b.(service.FilesPauser)
	if !ok {
		return nil, errdefs.Invalid("this node cannot pause keeping only files: pause with memory")
	}
	return sandboxAnswer(fp.PauseFiles(ctx, r.Msg.GetId()))
}

func (s *nodeService) Resume(ctx context.Context, r *req[nodepb.TimeoutRequest]) (*resp[nodepb.SandboxResponse], error) {
	return sandboxAnswer(s.b.Resume(ctx, r.Msg.GetId(), nodepb.Dur(r.Msg.GetTimeout())))
}

func (s *nodeService) Connect(ctx context.Context, r *req[nodepb.TimeoutRequest]) (*resp[nodepb.ConnectResponse], error) {
	sb, resumed, err := s.b.Connect(ctx, r.Msg.GetId(), nodepb.Dur(r.Msg.GetTimeout()))
	return answer(&nodepb.ConnectResponse{Sandbox: nodepb.FromSandbox(sb), Resumed: resumed}, err)
}

func (s *nodeService) Snapshot(ctx context.Context, r *req[nodepb.SnapshotRequest]) (*resp[nodepb.SnapshotResponse], error) {
	sn, err := s.b.Snapshot(ctx, r.Msg.GetId(), sandbox.SnapshotRequest{Name: r.Msg.GetName(), Metadata: r.Msg.GetMetadata(), Automatic: r.Msg.GetAutomatic()})
	return answer(&nodepb.SnapshotResponse{Snapshot: nodepb.FromSnapshot(sn)}, err)
}

func (s *nodeService) Fork(ctx context.Context, r *req[nodepb.ForkRequest]) (*resp[nodepb.ForkResponse], error) {
	md := r.Msg.GetMetadata()
	if r.Msg.GetHasMetadata() && md == nil {
		md = map[string]string{}
	}
	res, err := s.b.Fork(ctx, r.Msg.GetId(), int(r.Msg.GetCount()), nodepb.Dur(r.Msg.GetTimeout()), md)
	out := &nodepb.ForkResponse{}
	for _, fr := range res {
		out.Children = append(out.Children, &nodepb.ForkResponse_Child{Sandbox: nodepb.FromSandbox(fr.Sandbox), Error: nodepb.ChildErr(fr.Err)})
	}
	return answer(out, err)
}

func (s *nodeService) ListSnapshots(ctx context.Context, r *req[nodepb.ListSnapshotsRequest]) (*resp[nodepb.ListSnapshotsResponse], error) {
	list, err := s.b.ListSnapshots(ctx, r.Msg.GetSandboxId())
	out := &nodepb.ListSnapshotsResponse{}
	for _, sn := range list {
		out.Snapshots = append(out.Snapshots, nodepb.FromSnapshot(sn))
	}
	return answer(out, err)
}

func (s *nodeService) GetSnapshot(ctx context.Context, r *req[nodepb.SnapshotRef]) (*resp[nodepb.SnapshotResponse], error) {
	sn, err := s.b.GetSnapshot(ctx, r.Msg.GetId())
	return answer(&nodepb.SnapshotResponse{Snapshot: nodepb.FromSnapshot(sn)}, err)
}

func (s *nodeService) DeleteSnapshot(ctx context.Context, r *req[nodepb.SnapshotRef]) (*resp[nodepb.Empty], error) {
	return answer(&nodepb.Empty{}, s.b.DeleteSnapshot(ctx, r.Msg.GetId()))
}

func (s *nodeService) ListTemplates(ctx context.Context, r *req[nodepb.Empty]) (*resp[nodepb.ListTemplatesResponse], error) {
	list, err := s.b.ListTemplates(ctx)
	out := &nodepb.ListTemplatesResponse{}
	for _, t := range list {
		out.Templates = append(out.Templates, nodepb.FromTemplate(t))
	}
	return answer(out, err)
}

func (s *nodeService) GetTemplate(ctx context.Context, r *req[nodepb.TemplateRef]) (*resp[nodepb.TemplateResponse], error) {
	t, err := s.b.GetTemplate(ctx, r.Msg.GetName())
	return answer(&nodepb.TemplateResponse{Template: nodepb.FromTemplate(t)}, err)
}

func (s *nodeService) DeleteTemplate(ctx context.Context, r *req[nodepb.TemplateRef]) (*resp[nodepb.Empty], error) {
	return answer(&nodepb.Empty{}, s.b.DeleteTemplate(ctx, r.Msg.GetName()))
}

func (s *nodeService) CreateVolume(ctx context.Context, r *req[nodepb.CreateVolumeRequest]) (*resp[nodepb.VolumeResponse], error) {
	v, err := s.b.CreateVolume(ctx, r.Msg.GetOwner(), r.Msg.GetName())
	return answer(nodepb.FromVolume(v), err)
}

func (s *nodeService) GetVolume(ctx context.Context, r *req[nodepb.VolumeRef]) (*resp[nodepb.VolumeResponse], error) {
	v, err := s.b.GetVolume(ctx, r.Msg.GetOwner(), r.Msg.GetId())
	return answer(nodepb.FromVolume(v), err)
}

func (s *nodeService) DeleteVolume(ctx context.Context, r *req[nodepb.VolumeRef]) (*resp[nodepb.Empty], error) {
	return answer(&nodepb.Empty{}, s.b.DeleteVolume(ctx, r.Msg.GetOwner(), r.Msg.GetId()))
}
