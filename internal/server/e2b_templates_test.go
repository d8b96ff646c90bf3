package server_test

import (
	"os"
	"testing"

	"github.com/agentenv/agentenv/internal/imagebuild/imagebuildtest"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestE2BTemplates runs tests/e2b/templates.test.mjs: E2B's Template
// builder (fromImage, runCmd, copy, setEnvs, setWorkdir, setUser,
// setStartCmd with a ready check) built through the official SDK, a
// sandbox of the alias, a cached rebuild, a build's cpuCount/memoryMB
// sizing its sandboxes and a failing step. The image is
// a two-layer GNU image in a registry on loopback, which the server may
// reach only because --registry-allow names it. RUN steps get a network
// slot: the test's fake internet (network_test.go) checks its egress.
func TestE2BTemplates(t *testing.T) {
	testenv.NeedRunsc(t)
	host := imagebuildtest.Registry(t)
	ref := imagebuildtest.PushGNUImage(t, host, "e2b/gnu")
	dir, err := os.MkdirTemp("", "agentenv-tpl-")
	if err != nil {
		t.Fatal(err)
	}
	e := startServerWith(t, dir, "10.128.0.0/20", "tpl", func(c *server.Config) {
		c.StepBuilds.RegistryAllow = []string{host}
	})
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
		os.RemoveAll(dir)
	})
	in := fakeInternet(t, e)
	runSDKTest(t, e, "templates.test.mjs", "TEMPLATE_IMAGE="+ref, "INET_PUBLIC="+in.public, "INET_PRIVATE="+in.private)
}
