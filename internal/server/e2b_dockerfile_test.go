package server_test

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/imagebuild/imagebuildtest"
	"github.com/agentenv/agentenv/internal/server"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// TestE2BDockerfile runs tests/e2b/dockerfile.test.mjs: Dockerfile task
// templates through the official SDK's fromDockerfile. FROM names a
// template of the operator's (the server's "busybox", also a Docker Hub
// image's name, and "base" of the host's GNU tools, as a Debian template
// would be) and starts from it, not from a pull; FROM of another key's template is pulled instead, here through
// the server's registry mirror (a registry on loopback that holds an
// image of that name). Harbor's calls run on the result.
func TestE2BDockerfile(t *testing.T) {
	testenv.NeedRunsc(t)
	host := imagebuildtest.Registry(t)
	const other = "bobtask"
	imagebuildtest.PushGNUImage(t, host, "library/"+other)
	dir, err := os.MkdirTemp("", "agentenv-df-")
	if err != nil {
		t.Fatal(err)
	}
	e := startServerWith(t, dir, "10.134.0.0/20", "dkf", func(c *server.Config) {
		c.StepBuilds.RegistryAllow = []string{host}
		c.StepBuilds.RegistryMirror = host
		// Four templates: no idle sandboxes or containers of each kept
		// booted beside the test's own.
		c.Limits.HotPool, c.WarmPool = 0, 0
	})
	t.Cleanup(func() {
		if err := e.stop(); err != nil {
			t.Error(err)
		}
		os.RemoveAll(dir)
	})
	ctx := context.Background()
	none := func(client.BuildProgress) {}
	bob := client.New(e.api, e.proxy, bobKey)
	if _, err := bob.BuildTemplate(ctx, client.BuildRequest{Name: other, Busybox: true}, none); err != nil {
		t.Fatalf("bob's template: %v", err)
	}
	src := t.TempDir()
	testenv.GNURootfs(t, src)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(template.WriteTar(ctx, pw, src)) }()
	if _, err := e.client.UploadTemplate(ctx, "base", pr, none); err != nil {
		t.Fatalf("upload the GNU template base: %v", err)
	}
	runSDKTest(t, e, "dockerfile.test.mjs", "BUSYBOX_TEMPLATE=busybox", "GNU_TEMPLATE=base", "OTHER_TEMPLATE="+other,
		"LAYER2_FILE="+imagebuildtest.Layer2File, "LAYER2_CONTENT="+imagebuildtest.Layer2Content)
}
