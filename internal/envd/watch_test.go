package envd_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/client/api/envd/filesystempb"
	"github.com/agentenv/agentenv/internal/envd"
)

// upload writes data to path through POST /files, as the SDKs' write does.
func (d *daemon) upload(path, data string) error {
	req, err := http.NewRequest("POST", d.url+filesURL(path, d.user), strings.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("X-Access-Token", testToken)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("upload %s: status %d (%s)", path, resp.StatusCode, b)
	}
	return nil
}

// A polling watcher's GetWatcherEvents holds every change made before it
// was called: E2B's SDK tests write a file, then read the events once and
// want the write among them. The overwrite's chown comes first (CHMOD),
// then its truncate and write (WRITE); with four watchers at once, neither
// may be missing however the daemon's goroutines are scheduled.
func TestGetWatcherEventsHoldsEveryEarlierChange(t *testing.T) {
	d := startDaemon(t, envd.Config{AccessToken: testToken})
	const workers, rounds = 4, 25
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				if err := watchOneWrite(d, filepath.Join(t.TempDir(), fmt.Sprintf("w%d-%d", w, r))); err != nil {
					t.Errorf("worker %d, round %d: %v", w, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// watchOneWrite writes a file in dir, watches dir with entries, overwrites
// the file and checks the watcher's events: a CHMOD and a WRITE of it,
// each with the file's entry.
func watchOneWrite(d *daemon, dir string) error {
	ctx := context.Background()
	if _, err := d.fs.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: dir})); err != nil {
		return fmt.Errorf("make dir: %w", err)
	}
	const name = "watched.txt"
	file := filepath.Join(dir, name)
	if err := d.upload(file, "first"); err != nil {
		return err
	}
	cw, err := d.fs.CreateWatcher(ctx, connect.NewRequest(&pb.CreateWatcherRequest{Path: dir, IncludeEntry: true}))
	if err != nil {
		return fmt.Errorf("create watcher: %w", err)
	}
	id := cw.Msg.GetWatcherId()
	defer d.fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id}))
	if err := d.upload(file, "second, longer"); err != nil {
		return err
	}
	got, err := d.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		return fmt.Errorf("get watcher events: %w", err)
	}
	seen := map[pb.EventType]bool{}
	var all []string
	for _, ev := range got.Msg.GetEvents() {
		all = append(all, ev.GetType().String()+" "+ev.GetName())
		if ev.GetName() != name {
			continue
		}
		seen[ev.GetType()] = true
		if e := ev.GetEntry(); e.GetName() != name || e.GetPath() != file {
			return fmt.Errorf("%s event with entry %v, want the entry of %s", ev.GetType(), e, file)
		}
	}
	for _, want := range []pb.EventType{pb.EventType_EVENT_TYPE_CHMOD, pb.EventType_EVENT_TYPE_WRITE} {
		if !seen[want] {
			return fmt.Errorf("got events %v after the overwrite, want a %s of %s", all, want, name)
		}
	}
	return nil
}
