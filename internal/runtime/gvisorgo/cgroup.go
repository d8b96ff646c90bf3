package gvisorgo

import "github.com/agentenv/agentenv/internal/runtime/cgroups"

// removeCgroups removes the cgroups of sandbox id (see package cgroups: a
// create that fails early leaves them behind).
func (s settings) removeCgroups(id string) error {
	if !s.Cgroups {
		return nil
	}
	return cgroups.Remove(s.Parent, id)
}

// RemoveCgroups kills what is left in sandbox id's cgroups under parent
// (the runtime's CgroupParent) and removes them: for cleaning up after a
// host whose agent is gone for good (a test's nodes), where no Destroy
// will ever run.
func RemoveCgroups(parent, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	return cgroups.Remove(parent, id)
}
