package sandbox

// templateSize is the CPUs and memory a new sandbox of the template gets
// when its request names none: the template's own (E2B's build cpuCount
// and memoryMB), capped by the server's maximum, else the server's
// defaults. The cap is silent: a template built elsewhere, or before the
// operator lowered the maximum, still starts, with what this server gives.
func (m *Manager) templateSize(template string) (cpus, memMB int) {
	l := m.d.Limits
	cpus, memMB = l.DefaultCPUs, l.DefaultMemMB
	if m.d.Templates == nil {
		return cpus, memMB
	}
	t, err := m.d.Templates.Get(template)
	if err != nil {
		return cpus, memMB
	}
	if t.CPUs > 0 {
		cpus = min(t.CPUs, l.MaxCPUs)
	}
	if t.MemoryMB > 0 {
		memMB = min(t.MemoryMB, l.MaxMemMB)
	}
	return cpus, memMB
}

// sized fills the CPUs and memory req leaves out from its template. A
// request's own values win; Limits.check refuses them past the maximum.
func (m *Manager) sized(req *CreateRequest) {
	if req.CPUs != 0 && req.MemoryMB != 0 {
		return
	}
	cpus, memMB := m.templateSize(req.Template)
	if req.CPUs == 0 {
		req.CPUs = cpus
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = memMB
	}
}
