package imagebuildtest

import (
	"archive/tar"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func TestPushGNUImage(t *testing.T) {
	host := Registry(t)
	ref := PushGNUImage(t, host, "gnu")
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("got %d layers (%v), want 2", len(layers), err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cf.Config.Env, MarkerEnv+"="+MarkerValue) {
		t.Errorf("config Env %q lacks the marker", cf.Config.Env)
	}
	names := map[string]bool{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	if !names[Layer2File] || !names["usr/bin/bash"] {
		t.Errorf("flattened image lacks %s or usr/bin/bash", Layer2File)
	}
	if names[WhitedOut] {
		t.Errorf("flattened image has %s, which layer 2 whites out", WhitedOut)
	}
}
