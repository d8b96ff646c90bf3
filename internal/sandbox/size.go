package sandbox

import "github.com/agentenv/agentenv/internal/template"

// sizes says what a new sandbox of a template gets where its request says
// nothing: from the template's record, within the server's limits.
type sizes struct {
	templates *template.Store // nil: the limits' defaults
	limits    Limits
}

// of is the CPUs and memory a new sandbox of the template gets
// when its request names none: the template's own (E2B's build cpuCount
// and memoryMB), capped by the server's maximum, else the server's
// defaults. The cap is silent: a template built elsewhere, or before the
// operator lowered the maximum, still starts, with what this server gives.
func (s sizes) of(template string) (cpus, memMB int) {
	l := s.limits
	cpus, memMB = l.DefaultCPUs, l.DefaultMemMB
	if s.templates == nil {
		return cpus, memMB
	}
	t, err := s.templates.Get(template)
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

// fill fills the CPUs and memory req leaves out from its template. A
// request's own values win; Limits.check refuses them past the maximum.
func (s sizes) fill(req *CreateRequest) {
	if req.CPUs != 0 && req.MemoryMB != 0 {
		return
	}
	cpus, memMB := s.of(req.Template)
	if req.CPUs == 0 {
		req.CPUs = cpus
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = memMB
	}
}

// diskMB is the write-layer size of a new sandbox of the template: the
// template's own, else the server's default. A sandbox restored from a
// snapshot takes the snapshot's instead (the size is part of its spec).
func (s sizes) diskMB(template string) int {
	if s.templates != nil {
		if t, err := s.templates.Get(template); err == nil && t.DiskMB > 0 {
			return t.DiskMB
		}
	}
	return s.limits.DefaultDiskMB
}
