// Package ocitest builds small OCI images in tests with go-containerregistry
// (no registry, no Docker): layers from tar entries, written as an OCI
// image layout directory or a `docker save` tarball. It is for tests only.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a layer. Type defaults to a regular file
// (Body is its content); Link is a symlink's target.
type Entry struct {
	Name     string
	Type     byte
	Body     []byte
	Link     string
	Mode     int64
	UID, GID int
}

// File, Dir, Symlink and Whiteout make entries.
func File(name, body string, mode int64) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Body: []byte(body), Mode: mode}
}
func Dir(name string, mode int64) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: mode} }
func Symlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Link: target, Mode: 0o777}
}

// Whiteout deletes name (from lower layers) in the layer it is in.
func Whiteout(name string) Entry {
	dir, base := filepath.Split(name)
	return File(dir+".wh."+base, "", 0o644)
}

// Layer makes an uncompressed-tar layer of entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.Type
		if typ == 0 {
			typ = tar.TypeReg
		}
		hdr := &tar.Header{Name: e.Name, Typeflag: typ, Linkname: e.Link, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			Size: int64(len(e.Body)), ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image stacks layers (the first is the lowest) with cfg as the image's
// config, for this host's platform.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", goruntime.GOARCH, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// WriteLayout writes img as an OCI image layout directory under dir.
func WriteLayout(t testing.TB, img v1.Image, dir string) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
}

// WriteDockerSave writes img as a `docker save` tarball tagged tag.
func WriteDockerSave(t testing.TB, img v1.Image, path, tag string) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
}

// Busybox returns entries of a base layer with the host's static busybox
// (package busybox-static) and its applets as symlinks in /bin, so
// sandboxes of the image can run commands. It skips the test without it.
func Busybox(t testing.TB) []Entry {
	t.Helper()
	const bb = "/bin/busybox"
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Skipf("no static busybox (%v): install busybox-static (make setup)", err)
	}
	body, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	entries := []Entry{Dir("bin", 0o755), {Name: "bin/busybox", Type: tar.TypeReg, Body: body, Mode: 0o755}}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.ContainsAny(applet, "/[") {
			continue
		}
		entries = append(entries, Symlink("bin/"+applet, "busybox"))
	}
	return append(entries, Dir("etc", 0o755), File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1500:1500:app:/home/app:/bin/sh\n", 0o644),
		File("etc/group", "root:x:0:\napp:x:1500:\n", 0o644))
}
