package imagebuild_test

import (
	"context"
	"log/slog"
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
