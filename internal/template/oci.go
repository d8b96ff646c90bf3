package template

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentenv/agentenv/internal/errdefs"
)

// OCI images become templates on the client's side: the CLI reads the
// image (go-containerregistry), flattens its layers into one tar stream
// (whiteouts applied) and uploads it with the image's settings; the server
// unpacks it through ExtractTar, whose checks apply as to any upload.

// platform is the one sandboxes run: gVisor runs the host's architecture.
var platform = v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}

// OpenOCI reads an image from disk: an OCI image layout directory (the
// image for this platform, or its only image) or a `docker save` tarball
// holding one image.
func OpenOCI(path string) (v1.Image, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--oci %s: %w", path, err)
	}
	if !st.IsDir() {
		img, err := tarball.ImageFromPath(path, nil)
		if err != nil {
			return nil, fmt.Errorf("--oci %s: not a docker save tarball with one image (%w); for an OCI layout archive, unpack it and pass the directory", path, err)
		}
		return img, nil
	}
	if _, err := os.Stat(filepath.Join(path, "index.json")); err != nil {
		return nil, fmt.Errorf("--oci %s: no index.json: not an OCI image layout directory", path)
	}
	idx, err := layout.ImageIndexFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("--oci %s: %w", path, err)
	}
	return pickImage(idx, path)
}

// pickImage finds the image for this platform in an index (following
// nested indexes), or its only image.
func pickImage(idx v1.ImageIndex, where string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	var images []v1.Descriptor
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsIndex():
			sub, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			return pickImage(sub, where)
		case d.MediaType.IsImage():
			if d.Platform != nil && d.Platform.Satisfies(platform) {
				return idx.Image(d.Digest)
			}
			images = append(images, d)
		}
	}
	if len(images) == 1 && (images[0].Platform == nil || images[0].Platform.OS == "") {
		return idx.Image(images[0].Digest)
	}
	return nil, fmt.Errorf("%s: %d images and none for %s/%s: save only the image to use", where, len(images), platform.OS, platform.Architecture)
}

// PullImage reads an image from a registry (credentials from the Docker
// config, as docker pull would use), for this platform.
func PullImage(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("--image %q: %w", ref, err)
	}
	return PullRef(ctx, r, remote.WithAuthFromKeychain(authn.DefaultKeychain))
}

// PullRef reads the image r names from its registry, for this platform,
// with the caller's options (credentials, transport).
func PullRef(ctx context.Context, r name.Reference, opts ...remote.Option) (v1.Image, error) {
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithPlatform(platform)}, opts...)
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", r, err)
	}
	return img, nil
}

// ImageDefaults reads an image's Env, WorkingDir and User.
func ImageDefaults(img v1.Image) (Defaults, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Defaults{}, fmt.Errorf("image config: %w", err)
	}
	if cf.OS != "" && cf.OS != platform.OS || cf.Architecture != "" && cf.Architecture != platform.Architecture {
		return Defaults{}, errdefs.Invalid("image is for %s/%s; sandboxes here run %s/%s", cf.OS, cf.Architecture, platform.OS, platform.Architecture)
	}
	d := Defaults{Workdir: cf.Config.WorkingDir, User: cf.Config.User}
	for _, kv := range cf.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" || reservedEnv[k] {
			continue
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		d.Env[k] = v
	}
	return d, d.check()
}

// FlattenImage returns the image's filesystem as one tar stream: layers
// applied in order, whiteouts and opaque directories removing what lower
// layers had. Close it when done.
func FlattenImage(img v1.Image) io.ReadCloser {
	return mutate.Extract(img)
}
