package service

import (
	"context"
	"net/http"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/volume"
)

// Local's volumes: this host's volume store (`agentenv serve`, and each
// fleet node, whose API servers call these through the node service).

func (l *Local) volumes() (*volume.Store, error) {
	if l.Volumes == nil {
		return nil, errdefs.Unavailable("this server has no volumes (no volume store)")
	}
	return l.Volumes, nil
}

func (l *Local) CreateVolume(ctx context.Context, owner, name string) (VolumeInfo, error) {
	st, err := l.volumes()
	if err != nil {
		return VolumeInfo{}, err
	}
	v, err := st.Create(owner, name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return VolumeInfo{Volume: v, Token: st.Token(v.ID)}, nil
}

func (l *Local) ListVolumes(ctx context.Context, owner string) ([]volume.Volume, error) {
	st, err := l.volumes()
	if err != nil {
		return nil, err
	}
	return st.Volumes(owner), nil
}

func (l *Local) GetVolume(ctx context.Context, owner, id string) (VolumeInfo, error) {
	st, err := l.volumes()
	if err != nil {
		return VolumeInfo{}, err
	}
	v, err := st.Get(owner, id)
	if err != nil {
		return VolumeInfo{}, err
	}
	return VolumeInfo{Volume: v, Token: st.Token(v.ID)}, nil
}

func (l *Local) VolumeByName(ctx context.Context, owner, name string) (volume.Volume, error) {
	st, err := l.volumes()
	if err != nil {
		return volume.Volume{}, err
	}
	return st.ByName(owner, name)
}

func (l *Local) DeleteVolume(ctx context.Context, owner, id string) error {
	st, err := l.volumes()
	if err != nil {
		return err
	}
	return st.Delete(owner, id)
}

// VolumeContent serves the content API from this host's store.
func (l *Local) VolumeContent(w http.ResponseWriter, r *http.Request, id string) {
	st, err := l.volumes()
	if err != nil {
		contentError(w, err)
		return
	}
	serveContent(st, w, r, id)
}

// WriteContentError answers in the content API's error shape (for a
// backend that serves the content API elsewhere, e.g. a fleet's).
func WriteContentError(w http.ResponseWriter, err error) { contentError(w, err) }
