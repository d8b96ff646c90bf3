package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/fleet/nodepb"
	"github.com/agentenv/agentenv/internal/fleet/secret"
	"github.com/agentenv/agentenv/internal/fleet/store"
	"github.com/agentenv/agentenv/internal/snapshot"
)

// flakyPeer serves one file like a node's export route, but the first
// answer breaks off half-way: the copy must resume with a Range request
// and end with the exact bytes.
func flakyPeer(t *testing.T, data []byte, clusterSecret string, corrupt bool) (*httptest.Server, *atomic.Int32, *atomic.Value) {
	var calls atomic.Int32
	var lastRange atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if secret.NewVerifier(clusterSecret).Verify(r) != nil {
			nodepb.WriteHTTPError(w, fmt.Errorf("no secret: %w", errdefs.ErrUnauthenticated))
			return
		}
		n := calls.Add(1)
		lastRange.Store(r.Header.Get("Range"))
		body := data
		if corrupt {
			body = append([]byte("X"), data[1:]...)
		}
		if n == 1 {
			// Promise the whole file, send half, cut the connection.
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:len(body)/2])
			http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "", time.Time{}, strings.NewReader(string(body)))
	}))
	t.Cleanup(srv.Close)
	return srv, &calls, &lastRange
}

func TestCopyFileResumesAndChecks(t *testing.T) {
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	sum := sha256.Sum256(data)
	hash := "w-" + hex.EncodeToString(sum[:]) // a chunk named by its SHA-256
	for _, tc := range []struct {
		name    string
		corrupt bool
		wantErr bool
	}{
		{"broken transfer resumes", false, false},
		{"corrupt bytes are refused", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, calls, lastRange := flakyPeer(t, data, "s3cret-s3cret-s3cret", tc.corrupt)
			n := &Node{cfg: Config{Secret: "s3cret-s3cret-s3cret"}, auth: secret.NewAuth("s3cret-s3cret-s3cret"), log: slog.Default(), http: &http.Client{Transport: nodepb.NewTransport(nil)}}
			peer := store.NodeRecord{Name: "peer", Addr: strings.TrimPrefix(srv.URL, "http://")}
			dst := filepath.Join(t.TempDir(), "f")
			err := n.copyChunk(context.Background(), peer, "snap-0000000000000001", hash, int64(len(data)), dst)
			if err != nil {
				t.Fatalf("copyChunk: %v", err)
			}
			// The store checks each chunk it imports like this.
			verr := snapshot.VerifyChunk(hash, dst)
			if tc.wantErr {
				if verr == nil {
					t.Fatal("copy of corrupt bytes passed the check against its name")
				}
				return
			}
			if verr != nil {
				t.Fatal(verr)
			}
			got, _ := os.ReadFile(dst)
			if len(got) != len(data) || sha256.Sum256(got) != sum {
				t.Fatalf("copied %d bytes (sha256 %x), want %d (%s)", len(got), sha256.Sum256(got), len(data), hash)
			}
			if c := calls.Load(); c != 2 {
				t.Fatalf("peer asked %d times, want 2 (the break, then one ranged resume)", c)
			}
			if got, want := lastRange.Load(), fmt.Sprintf("bytes=%d-", len(data)/2); got != want {
				t.Fatalf("resume asked for Range %q, want %q", got, want)
			}
		})
	}
}
