package ocispec

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/runscbin"
)

func TestLowersNeedARunscThatStacks(t *testing.T) {
	stacks := runscbin.Features{RootfsLowerImages: true}
	for _, c := range []struct {
		name   string
		lowers []string
		f      runscbin.Features
		ok     bool
	}{
		{"one image", nil, runscbin.Features{}, true},
		{"a stack", []string{"/l/a.erofs", "/l/b.erofs"}, stacks, true},
		{"a stack without the patch", []string{"/l/a.erofs"}, runscbin.Features{}, false},
		{"a relative layer", []string{"l/a.erofs"}, stacks, false},
		{"the separator in a path", []string{"/l/a:b.erofs"}, stacks, false},
	} {
		s := runtime.Spec{ID: "sb", Dir: t.TempDir(), Image: "/l/top.erofs", Lowers: c.lowers}
		bundle, err := WriteBundle(s, "", c.f)
		if !c.ok {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		spec := Build(s, filepath.Join(bundle, "rootfs"), "", c.f)
		got, want := spec.Annotations[LowersAnnotation], map[bool]string{true: "/l/a.erofs:/l/b.erofs", false: ""}[len(c.lowers) > 0]
		if got != want {
			t.Errorf("%s: annotation %q, want %q", c.name, got, want)
		}
		if src := spec.Annotations["dev.gvisor.spec.rootfs.source"]; src != s.Image {
			t.Errorf("%s: rootfs source %q, want the top image %q", c.name, src, s.Image)
		}
	}
}
