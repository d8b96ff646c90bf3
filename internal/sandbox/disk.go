package sandbox

import (
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"golang.org/x/sys/unix"
)

// diskMB is the write-layer size of a new sandbox of the template: the
// template's own, else the server's default. A sandbox restored from a
// snapshot takes the snapshot's instead (the size is part of its spec).
func (m *Manager) diskMB(template string) int {
	if t, err := m.d.Templates.Get(template); err == nil && t.DiskMB > 0 {
		return t.DiskMB
	}
	return m.d.Limits.DefaultDiskMB
}

// LayerBytes is the host disk that a sandbox's write layer takes now (the
// allocated blocks of its sparse file); 0 when it has none.
func (m *Manager) LayerBytes(id string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(ocispec.FilestorePath(m.rec.dir(id), id), &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
