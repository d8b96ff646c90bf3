package sandbox

import (
	"github.com/agentenv/agentenv/internal/runtime/ocispec"
	"golang.org/x/sys/unix"
)

// LayerBytes is the host disk that a sandbox's write layer takes now (the
// allocated blocks of its sparse file); 0 when it has none.
func (m *Manager) LayerBytes(id string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(ocispec.FilestorePath(m.rec.dir(id), id), &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
