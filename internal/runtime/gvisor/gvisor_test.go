package gvisor_test

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/runtime"
	"github.com/agentenv/agentenv/internal/runtime/gvisor"
	"github.com/agentenv/agentenv/internal/runtime/runtimetest"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

func TestConformance(t *testing.T) {
	runsc := testenv.NeedRunsc(t)
	dir := t.TempDir()
	store, err := template.Open(filepath.Join(dir, "templates"), testenv.BuildEnvd(t, dir), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureBusybox(t.Context()); err != nil {
		t.Fatal(err)
	}
	env := runtimetest.Env{Image: store.ImagePath("busybox"), Dir: filepath.Join(dir, "sandboxes"), CgroupParent: "agentenv"}
	runtimetest.Run(t, env, func(t *testing.T) runtime.Runtime {
		g, err := gvisor.New(gvisor.Config{Runsc: runsc, Root: filepath.Join(dir, "runsc"), Cgroups: true})
		if err != nil {
			t.Fatal(err)
		}
		return g
	})
}
