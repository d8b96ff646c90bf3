package imagebuild_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/imagebuild"
	"github.com/agentenv/agentenv/internal/imagebuild/imagebuildtest"
	"github.com/agentenv/agentenv/internal/template"
	"github.com/agentenv/agentenv/internal/testenv"
)

// BenchmarkPrepare measures a build of an ENV, a RUN and a WORKDIR step: cold (every step run, the base cached) and fully cached,
// with CPU per build (this process and its children: runsc, cp).
//
//	scripts/isolate.sh go test ./internal/imagebuild/ -run XXX -bench Prepare -benchtime 5x
func BenchmarkPrepare(b *testing.B) {
	runsc := testenv.NeedRunsc(b)
	testenv.NeedCommand(b, "mkfs.erofs", "template store")
	dir := b.TempDir()
	envd := testenv.BuildEnvd(b, dir)
	log := slog.New(slog.DiscardHandler)
	store, err := template.Open(filepath.Join(dir, "templates"), envd, log)
	if err != nil {
		b.Fatal(err)
	}
	host := imagebuildtest.Registry(b)
	ref := imagebuildtest.PushGNUImage(b, host, "gnu")
	bld, err := imagebuild.New(imagebuild.Config{Dir: filepath.Join(dir, "build"), Runsc: runsc, Templates: store, Registries: []string{host}, Log: log})
	if err != nil {
		b.Fatal(err)
	}
	spec := func(i int) imagebuild.Spec {
		return imagebuild.Spec{Name: "bench", FromImage: ref, Steps: []imagebuild.Step{
			{Type: "ENV", Args: []string{"N", time.Now().Format(time.RFC3339Nano)}},
			{Type: "RUN", Args: []string{"echo $N > /n", "root"}},
			{Type: "WORKDIR", Args: []string{"/srv"}},
		}}
	}
	// Warm the base.
	if _, cleanup, err := bld.Prepare(context.Background(), spec(0), nil); err != nil {
		b.Fatal(err)
	} else {
		cleanup()
	}
	for _, c := range []struct {
		name   string
		cached bool
	}{{"cold", false}, {"cached", true}} {
		b.Run(c.name, func(b *testing.B) {
			fixed := spec(0)
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				s := fixed
				if !c.cached {
					s = spec(i)
				}
				_, cleanup, err := bld.Prepare(context.Background(), s, nil)
				if err != nil {
					b.Fatal(err)
				}
				cleanup()
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuTime is the user+system time of this process and its waited-for
// children.
func cpuTime() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

// BenchmarkOneFileTemplate measures a template of one 1 MiB COPY on a
// cached base, thin (a layer stacked on the base's image) and flat (the
// whole root written again): the build's time (steps and store) and the
// disk the template adds. The base is the GNU test userland with the
// host's /usr/share under it, about the size of Debian's.
//
//	go test ./internal/imagebuild/ -run XXX -bench OneFileTemplate -benchtime 5x
func BenchmarkOneFileTemplate(b *testing.B) {
	runsc := testenv.NeedRunsc(b)
	testenv.NeedCommand(b, "mkfs.erofs", "template store")
	dir := b.TempDir()
	envd := testenv.BuildEnvd(b, dir)
	log := slog.New(slog.DiscardHandler)
	store, err := template.Open(filepath.Join(dir, "templates"), envd, log)
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(dir, "base")
	testenv.GNURootfs(b, root)
	if out, err := exec.Command("cp", "-a", "/usr/share", filepath.Join(root, "usr")).CombinedOutput(); err != nil {
		b.Fatalf("pad the base: %v %s", err, out)
	}
	var tarball bytes.Buffer
	if err := template.WriteTar(context.Background(), &tarball, root); err != nil {
		b.Fatal(err)
	}
	os.RemoveAll(root)
	base, err := store.Build(context.Background(), template.BuildRequest{Name: "base", Upload: &tarball}, func(template.Progress) {})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("base: image %d MiB", base.ImageSize>>20)
	body := make([]byte, 1<<20)
	for _, thin := range []bool{true, false} {
		name := map[bool]string{true: "thin", false: "flat"}[thin]
		b.Run(name, func(b *testing.B) {
			bld, err := imagebuild.New(imagebuild.Config{Dir: filepath.Join(dir, "build-"+name), Runsc: runsc, Templates: store, Log: log, ThinLayers: thin})
			if err != nil {
				b.Fatal(err)
			}
			var own int64
			for i := 0; i < b.N; i++ {
				rand.Read(body)
				hash := fmt.Sprintf("%s-%d", name, i)
				var tb bytes.Buffer
				tw := tar.NewWriter(&tb)
				tw.WriteHeader(&tar.Header{Name: "task.py", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
				tw.Write(body)
				tw.Close()
				files := map[string][]byte{hash: tb.Bytes()}
				spec := imagebuild.Spec{Name: fmt.Sprintf("%s-%d", name, i), FromTemplate: "base",
					Files: func(h string) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(files[h])), nil },
					Steps: []imagebuild.Step{{Type: "COPY", Args: []string{"task.py", "/task/task.py"}, FilesHash: hash}}}
				if i == 0 {
					// The base phase's layer, once: cached for the others.
					_, cleanup, err := bld.Prepare(context.Background(), imagebuild.Spec{Name: "warm", FromTemplate: "base"}, nil)
					if err != nil {
						b.Fatal(err)
					}
					cleanup()
					b.ResetTimer()
				}
				req, cleanup, err := bld.Prepare(context.Background(), spec, nil)
				if err != nil {
					b.Fatal(err)
				}
				t, err := store.Build(context.Background(), req, func(template.Progress) {})
				cleanup()
				if err != nil {
					b.Fatal(err)
				}
				own += t.OwnBytes
			}
			b.ReportMetric(float64(own)/float64(b.N)/1024, "KiB/template")
		})
	}
}
