// Package imagebuildtest gives tests a real OCI registry on loopback and a
// two-layer image of the host's GNU userland to push into it, so builds
// from an image (imagebuild, and E2B's fromImage through the API) are
// tested against go-containerregistry's registry, never a stand-in. It must
// not reach any network but loopback.
package imagebuildtest

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// Registry starts an OCI registry on 127.0.0.1 (plain HTTP, as
// go-containerregistry speaks to loopback registries) and returns its
// host:port. t.Cleanup stops it.
func Registry(t testing.TB) (host string) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(discardLogger())))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// The image PushGNUImage pushes: what its layers and config hold, for
// tests to check.
const (
	// MarkerEnv is set in the image config's Env to MarkerValue.
	MarkerEnv   = "IMAGEBUILD_MARKER"
	MarkerValue = "from-image-config"
	// ImagePath is the image config's PATH.
	ImagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// Layer2File is added by the second layer, with Layer2Content.
	Layer2File    = "etc/imagebuild-layer2"
	Layer2Content = "second layer\n"
	// WhitedOut is a file of the first layer the second layer deletes.
	WhitedOut = "usr/bin/yes"
)

// PushGNUImage builds a two-layer image and pushes it to host (a registry
// from Registry) as host/repo:latest, returning that reference. Layer 1 is
// testenv.GNURootfs (bash, coreutils, tar, ...); layer 2 adds Layer2File and
// a whiteout of WhitedOut. The config sets Env PATH=ImagePath and
// MarkerEnv=MarkerValue, for this host's architecture.
func PushGNUImage(t testing.TB, host, repo string) (ref string) {
	t.Helper()
	dir := t.TempDir()
	testenv.GNURootfs(t, dir)
	var l1 bytes.Buffer
	if err := template.WriteTar(context.Background(), &l1, dir); err != nil {
		t.Fatalf("layer 1: %v", err)
	}
	l2 := layer2(t)
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, l1.Bytes()), tarLayer(t, l2))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", hostArch()
	cf.Config.Env = []string{"PATH=" + ImagePath, MarkerEnv + "=" + MarkerValue}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref = host + "/" + repo + ":latest"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func layer2(t testing.TB) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	now := time.Now()
	dir, base, _ := cutLast(WhitedOut)
	entries := []struct {
		name, body string
	}{
		{Layer2File, Layer2Content},
		{dir + "/.wh." + base, ""},
	}
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func tarLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func cutLast(p string) (dir, base string, ok bool) {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", p, false
	}
	return p[:i], p[i+1:], true
}

// discardLogger keeps the registry's request log out of test output.
func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

func hostArch() string { return goruntime.GOARCH }
