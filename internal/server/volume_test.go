package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/client"
)

// volumeAPI calls the server's /volumes routes with the test key.
func (e *env) volumeAPI(t *testing.T, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.api+path, r)
	req.Header.Set("X-API-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// TestVolumeForkSnapshotAndOwnership: a fork child mounts its parent's
// volume and writes through it; a restore of a snapshot mounts the volume
// again (the snapshot does not contain its files); a file the sandbox's
// user writes is the user's, on busybox and on a GNU userland; a snapshot
// of a deleted volume is refused with a clear error.
func TestVolumeForkSnapshotAndOwnership(t *testing.T) {
	e := sharedServer(t)
	for _, tmpl := range []string{"busybox", gnuTemplate(t, e)} {
		t.Run(tmpl, func(t *testing.T) {
			ctx := context.Background()
			code, body := e.volumeAPI(t, "POST", "/volumes", map[string]string{"name": "fork-" + tmpl})
			if code != http.StatusCreated {
				t.Fatalf("create volume: %d %s", code, body)
			}
			var vol struct{ VolumeID, Name string }
			json.Unmarshal(body, &vol)
			defer e.volumeAPI(t, "DELETE", "/volumes/"+vol.VolumeID, nil)

			parent := e.create(t, client.CreateRequest{TemplateID: tmpl, VolumeMounts: []client.VolumeMount{{Name: vol.Name, Path: "/mnt/v"}}})
			if got := e.sh(t, parent, "echo parent > /mnt/v/p.txt && stat -c %U /mnt/v/p.txt"); strings.TrimSpace(string(got.Stdout)) != "user" {
				t.Errorf("owner of a file the sandbox's user wrote in the volume: %q (exit %d, %s), want user", got.Stdout, got.ExitCode, got.Stderr)
			}
			// A sized volume (testVolumeMB): writing past it fails inside the
			// sandbox with ENOSPC, and what was written before stays.
			if got := e.sh(t, parent, "dd if=/dev/zero of=/mnt/v/big bs=1M count=100 2>&1; echo exit=$?; rm -f /mnt/v/big; cat /mnt/v/p.txt"); !strings.Contains(string(got.Stdout), "No space left on device") || strings.Contains(string(got.Stdout), "exit=0") || !strings.HasSuffix(string(got.Stdout), "parent\n") {
				t.Errorf("writing 100 MiB into a %d MiB volume: %q, want ENOSPC and the earlier file intact", testVolumeMB, got.Stdout)
			}
			kids := e.fork(t, e.client, parent.SandboxID, 2)
			for i, k := range kids {
				if len(k.VolumeMounts) != 1 || k.VolumeMounts[0].Path != "/mnt/v" {
					t.Errorf("fork child %d's volume mounts: %+v", i, k.VolumeMounts)
				}
				e.sh(t, k, "echo child > /mnt/v/child"+string(rune('0'+i)))
			}
			if got := e.sh(t, parent, "cat /mnt/v/child0 /mnt/v/child1"); string(got.Stdout) != "child\nchild\n" {
				t.Errorf("the parent reads its children's writes: %q %s", got.Stdout, got.Stderr)
			}

			sn, err := e.client.SnapshotSandbox(ctx, parent.SandboxID, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer e.client.DeleteSnapshot(ctx, sn.SnapshotID)
			e.sh(t, parent, "echo after-snapshot > /mnt/v/later.txt")
			restored := e.create(t, client.CreateRequest{TemplateID: sn.SnapshotID})
			if got := e.sh(t, restored, "cat /mnt/v/later.txt"); string(got.Stdout) != "after-snapshot\n" {
				t.Errorf("a restore mounts the live volume (not a copy in the snapshot): %q %s", got.Stdout, got.Stderr)
			}

			if code, body := e.volumeAPI(t, "DELETE", "/volumes/"+vol.VolumeID, nil); code != http.StatusConflict {
				t.Errorf("delete while mounted: %d %s, want 409", code, body)
			}
			for _, sb := range append(kids, parent, restored) {
				if err := e.client.KillSandbox(ctx, sb.SandboxID); err != nil {
					t.Fatal(err)
				}
			}
			if code, body := e.volumeAPI(t, "DELETE", "/volumes/"+vol.VolumeID, nil); code != http.StatusNoContent {
				t.Fatalf("delete after every sandbox is gone: %d %s", code, body)
			}
			_, err = e.client.CreateSandbox(ctx, client.CreateRequest{TemplateID: sn.SnapshotID})
			if err == nil || !strings.Contains(err.Error(), "was deleted") {
				t.Errorf("restore of a snapshot whose volume was deleted: %v, want a clear refusal", err)
			}
		})
	}
}
