package seccompgen

import (
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/devices/nvproxy/nvconf"
	"gvisor.dev/gvisor/pkg/sentry/platform"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// moduleDir returns the directory of the pinned gVisor module in the
// module cache (the version agentenv links).
func moduleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gvisor.dev/gvisor").Output()
	if err != nil {
		t.Fatalf("go list -m gvisor.dev/gvisor: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestRenderStubs(t *testing.T) {
	dir := moduleDir(t)
	progs := []precompiledseccomp.Program{
		{Name: "b", Bytecode32: []uint32{0x20, 0x4}, VarOffsets: map[string][]int{"x": {1}, "y": nil}},
		{Name: "a", Bytecode32: []uint32{0x6, 0x7fff0000}, VarOffsets: map[string][]int{}},
	}
	for _, tg := range Targets {
		t.Run(tg.File, func(t *testing.T) {
			stub, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(tg.File)))
			if err != nil {
				t.Fatal(err)
			}

			// No programs: the stub with precompilation turned on.
			got, err := Render(stub, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Replace(stub, []byte(disabledLine), []byte(enabledLine), 1)
			if !bytes.Equal(got, want) {
				t.Errorf("Render(stub, nil) differs from the stub beyond the disabled flag:\n%s", got)
			}

			got, err = Render(stub, progs)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parser.ParseFile(token.NewFileSet(), tg.File, got, parser.AllErrors); err != nil {
				t.Fatalf("rendered file does not parse: %v", err)
			}
			// Sorted by name, in registerPrograms, as upstream's generator
			// writes them (Program.Registration with a tab indent).
			regs := mapLine + "\n" + progs[1].Registration("\t", "precompiledseccomp", "programs") +
				progs[0].Registration("\t", "precompiledseccomp", "programs") + assignLine + "\n"
			if !bytes.Contains(got, []byte(regs)) {
				t.Errorf("rendered file lacks the registrations in order; got:\n%s", got)
			}
			if n := bytes.Count(got, []byte("\n")) - bytes.Count(stub, []byte("\n")); n != strings.Count(regs, "\n")-2 {
				t.Errorf("rendered file has %d more lines than the stub, want %d", n, strings.Count(regs, "\n")-2)
			}

			if _, err := Render(got, progs); err == nil {
				t.Error("Render of a rendered file succeeded, want an error")
			}
			dup := append(progs, progs[0])
			if _, err := Render(stub, dup); err == nil || !strings.Contains(err.Error(), "duplicate") {
				t.Errorf("Render with a duplicate name: err = %v, want duplicate", err)
			}
		})
	}
}

// TestSelect checks the selection on keys made by gVisor's own ConfigKey,
// so that a change of the key format fails here rather than in a build.
func TestSelect(t *testing.T) {
	systrapInfo := (*systrap.Systrap)(nil).SeccompInfo()
	kvm := platform.StaticSeccompInfo{PlatformName: "kvm"}
	caps := nvconf.PopularCapabilitySets()
	sentry := []struct {
		opt  sentryconfig.Options
		keep bool
	}{
		{sentryconfig.Options{Platform: systrapInfo, HostFilesystem: true}, true},
		{sentryconfig.Options{Platform: systrapInfo}, true},
		{sentryconfig.Options{Platform: systrapInfo, HostNetwork: true, HostNetworkRawSockets: true}, true},
		{sentryconfig.Options{Platform: kvm, HostFilesystem: true}, false},
		{sentryconfig.Options{Platform: systrapInfo, NVProxy: true, NVProxyCaps: caps[len(caps)-1]}, false},
		{sentryconfig.Options{Platform: systrapInfo, TPUProxy: true}, false},
		{sentryconfig.Options{Platform: systrapInfo, RDMAProxy: true}, false},
	}
	var progs []precompiledseccomp.Program
	want := map[string]bool{}
	for _, c := range sentry {
		progs = append(progs, precompiledseccomp.Program{Name: c.opt.ConfigKey()})
		want[c.opt.ConfigKey()] = c.keep
	}
	gofer := []struct {
		opt  goferconfig.Options
		keep bool
	}{
		{goferconfig.Options{DirectFS: true}, true},
		{goferconfig.Options{DirectFS: true, LisafsNeeded: true}, true},
		{goferconfig.Options{DirectFS: true, CgoEnabled: true}, false},
		{goferconfig.Options{UDSOpenEnabled: true}, false},
		{goferconfig.Options{UDSCreateEnabled: true}, false},
	}
	var goferProgs []precompiledseccomp.Program
	for _, c := range gofer {
		goferProgs = append(goferProgs, precompiledseccomp.Program{Name: c.opt.ConfigKey()})
		want[c.opt.ConfigKey()] = c.keep
	}
	for i, in := range [][]precompiledseccomp.Program{progs, goferProgs} {
		got, err := Select(in, Targets[i].Keep)
		if err != nil {
			t.Fatalf("Select(%s): %v", Targets[i].File, err)
		}
		kept := map[string]bool{}
		for _, p := range got {
			kept[p.Name] = true
		}
		for _, p := range in {
			if kept[p.Name] != want[p.Name] {
				t.Errorf("%s: kept %q = %v, want %v", Targets[i].File, p.Name, kept[p.Name], want[p.Name])
			}
		}
	}
	if _, err := Select([]precompiledseccomp.Program{{Name: `GOARCH="amd64" Other=true`}}, Targets[0].Keep); err == nil {
		t.Error("Select of a key without the fields succeeded, want an error")
	}
}

func TestParseKey(t *testing.T) {
	got := ParseKey(`GOARCH="amd64" Platform="systrap" NVProxyCaps= Caps=a b TPUProxy=false`)
	want := map[string]string{"GOARCH": `"amd64"`, "Platform": `"systrap"`, "NVProxyCaps": "", "Caps": "a b", "TPUProxy": "false"}
	if len(got) != len(want) {
		t.Errorf("ParseKey = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("ParseKey field %s = %q, want %q", k, got[k], v)
		}
	}
}
