package node

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/volume"
)

// alterAt flips one byte of a stream at offset off: a request changed
// on the way.
type alterAt struct {
	r   io.ReadCloser
	off int64
	pos int64
}

func (a *alterAt) Read(p []byte) (int, error) {
	k, err := a.r.Read(p)
	if a.off >= a.pos && a.off < a.pos+int64(k) {
		p[a.off-a.pos] ^= 0xff
	}
	a.pos += int64(k)
	return k, err
}

func (a *alterAt) Close() error { return a.r.Close() }

// A request to a node, signed with the cluster secret and captured on
// the way (a volume write, as an API server forwards a client's), is
// good once, for itself: replayed, or sent with another body, query or
// host, the node refuses it and the volume keeps what its owner wrote;
// a large write changed in the middle of its stream leaves no changed
// file either.
func TestNodeRefusesReplayedOrAlteredRequests(t *testing.T) {
	const clusterSecret = "s3cret-s3cret-s3cret"
	vols, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vols.Close)
	v, err := vols.Create("alice", "data")
	if err != nil {
		t.Fatal(err)
	}
	n := New(Config{Name: "self", Secret: clusterSecret, Log: slog.Default()})
	n.host = &service.Local{Volumes: vols}
	srv := httptest.NewServer(n.Handler())
	t.Cleanup(srv.Close)
	const host = "n1.fleet.test:3100"

	// signed is a write of body to p, signed as an API server signs it.
	signed := func(p string, body []byte) *http.Request {
		r, err := http.NewRequest(http.MethodPut, srv.URL+"/fleet/v1/volumecontent/"+v.ID+"/file?force=true&path="+p, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		r.Host = host
		r.Header.Set("Authorization", "Bearer "+vols.Token(v.ID))
		n.auth.Sign(r)
		return r
	}
	// send sends r with its captured header (and the body a party on
	// the way chose).
	send := func(r *http.Request) int {
		t.Helper()
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// like is r's header on another request.
	like := func(r *http.Request, method, url, host string, body []byte) *http.Request {
		o, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		o.Header, o.Host = r.Header.Clone(), host
		return o
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(vols.DataDir(v.ID), p))
		if err != nil {
			return "(" + err.Error() + ")"
		}
		return string(b)
	}

	first := signed("/notes.txt", []byte("alice v1"))
	captured := first.Clone(first.Context())
	if got := send(first); got != http.StatusCreated {
		t.Fatalf("a signed write: status %d, want 201", got)
	}
	if got := send(signed("/notes.txt", []byte("alice v2"))); got != http.StatusCreated {
		t.Fatalf("a second signed write: status %d, want 201", got)
	}
	url := srv.URL + "/fleet/v1/volumecontent/" + v.ID + "/file?force=true&path=/notes.txt"
	for _, tc := range []struct {
		name string
		r    func() *http.Request
	}{
		{"the captured request replayed", func() *http.Request {
			return like(captured, http.MethodPut, url, host, []byte("alice v1"))
		}},
		{"another body", func() *http.Request {
			return like(signed("/notes.txt", []byte("alice v3")), http.MethodPut, url, host, []byte("bob's text"))
		}},
		{"another query", func() *http.Request {
			return like(signed("/other.txt", []byte("bob's text")), http.MethodPut, url, host, []byte("bob's text"))
		}},
		{"another host", func() *http.Request {
			return like(signed("/notes.txt", []byte("bob's text")), http.MethodPut, url, "n2.fleet.test:3100", []byte("bob's text"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := send(tc.r()); got != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", got)
			}
			if got := read("notes.txt"); got != "alice v2" {
				t.Errorf("notes.txt holds %q, want %q", got, "alice v2")
			}
		})
	}

	t.Run("a large write changed on the way", func(t *testing.T) {
		big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10) // 4 MiB: streamed
		r := signed("/big.bin", big)
		r.Body = &alterAt{r: r.Body, off: 3 << 20}
		if got := send(r); got == http.StatusCreated {
			t.Errorf("status %d, want a refusal", got)
		}
		if got := read("big.bin"); strings.HasPrefix(got, "0123") {
			t.Errorf("big.bin holds %d bytes after a changed write, want none", len(got))
		}
		if got := send(signed("/big.bin", big)); got != http.StatusCreated {
			t.Fatalf("the same write unchanged: status %d, want 201", got)
		}
		if got := read("big.bin"); got != string(big) {
			t.Errorf("big.bin holds %d bytes, want the %d written", len(got), len(big))
		}
	})
}
