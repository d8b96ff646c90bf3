package seccompgen

import (
	"testing"

	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// BenchmarkFilter measures what each sandbox start spends on its seccomp
// filters, for the options agentenv's sandboxes use (systrap, netstack,
// directfs; the keys the seccomp test finds in runsc's logs): compiling
// them, as a stub runsc does in filter.Install, against rendering the
// precompiled program, as agentenv's build does. Installing is the same
// in both and is left out. The sentry's render needs every precompiled
// program first (a minute or more); -short skips it.
func BenchmarkFilter(b *testing.B) {
	sentry := sentryconfig.Options{Platform: (*systrap.Systrap)(nil).SeccompInfo(), HostFilesystem: true, ControllerFD: 10}
	gofer := goferconfig.Options{DirectFS: true}
	cases := []struct {
		name     string
		key      string
		vars     func() precompiledseccomp.Values
		compile  func() *seccomp.Program
		programs func() ([]precompiledseccomp.Program, error)
	}{
		{"sentry", sentry.ConfigKey(), sentry.Vars, func() *seccomp.Program {
			rules, deny := sentryconfig.Rules(sentry)
			return &seccomp.Program{
				RuleSets: []seccomp.RuleSet{{Rules: deny}, {Rules: rules, Action: seccomp.Allow}},
				Options:  sentryconfig.SeccompOptions(sentry),
			}
		}, sentryconfig.PrecompiledPrograms},
		{"gofer", gofer.ConfigKey(), gofer.Vars, func() *seccomp.Program {
			rules, deny := goferconfig.Rules(gofer)
			return &seccomp.Program{RuleSets: []seccomp.RuleSet{{Rules: deny}, {Rules: rules, Action: seccomp.Allow}}}
		}, goferconfig.PrecompiledPrograms},
	}
	for _, c := range cases {
		b.Run(c.name+"/compile", func(b *testing.B) {
			var insns []bpf.Instruction
			for i := 0; i < b.N; i++ {
				var err error
				if insns, _, err = c.compile().Build(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(insns)), "instructions")
		})
		b.Run(c.name+"/render", func(b *testing.B) {
			if testing.Short() && c.name == "sentry" {
				b.Skip("-short: precompiling every sentry program takes minutes")
			}
			programs, err := c.programs()
			if err != nil {
				b.Fatal(err)
			}
			var prog *precompiledseccomp.Program
			for i := range programs {
				if programs[i].Name == c.key {
					prog = &programs[i]
				}
			}
			if prog == nil {
				b.Fatalf("no precompiled program for %s", c.key)
			}
			b.ResetTimer()
			var insns []bpf.Instruction
			for i := 0; i < b.N; i++ {
				// RenderInstructions writes into the program it is given,
				// as runsc does with its own copy; the result is the same.
				if insns, err = prog.RenderInstructions(c.vars()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(insns)), "instructions")
		})
	}
}
