//go:build agentenv_patched_gvisor

package seccompgen

import "gvisor.dev/gvisor/pkg/sentry/platform/systrap"

// The stub processes' programs (patches/gvisor/0007) exist only in the
// patched module copy the runsc build renders into, so this target is
// built only there, with the build tag the build gives the generator.
func init() {
	Targets = append(Targets, Target{
		File:     "pkg/sentry/platform/systrap/stub_precompiled.go",
		Programs: systrap.PrecompiledStubPrograms,
	})
}
