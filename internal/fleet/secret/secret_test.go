package secret

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
)

const testSecret = "test-secret-0123456789abcdef"

// wire sends r as a client would and returns it as a node's server
// reads it (http.Request.Write, then http.ReadRequest).
func wire(t *testing.T, r *http.Request) *http.Request {
	t.Helper()
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return serverSide(t, buf.Bytes())
}

func serverSide(t *testing.T, raw []byte) *http.Request {
	t.Helper()
	got, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// signed returns the wire form of a signed request.
func signed(t *testing.T, a Auth, method, url string, body io.Reader, now time.Time) []byte {
	t.Helper()
	r, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.signAt(r, now); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := r.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRPCAuth(t *testing.T) {
	a, v := NewAuth(testSecret), NewVerifier(testSecret)
	for _, tc := range []struct {
		name string
		body func() io.Reader
		want string
	}{
		{name: "no body", body: func() io.Reader { return nil }},
		{name: "a body in memory", body: func() io.Reader { return strings.NewReader(`{"sandboxId":"x"}`) }, want: `{"sandboxId":"x"}`},
		{name: "a streamed body", body: func() io.Reader { return io.MultiReader(strings.NewReader("upload "), strings.NewReader("bytes")) }, want: "upload bytes"},
		{name: "a streamed body of many chunks", body: func() io.Reader { return io.LimitReader(zeros{}, 5*maxChunk+7) }, want: string(make([]byte, 5*maxChunk+7))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := serverSide(t, signed(t, a, http.MethodPost, "http://node:3100/fleet/v1/build?x=1", tc.body(), time.Now()))
			if strings.Contains(r.Header.Get(AuthHeader), "test-secret") {
				t.Fatal("the header carries the secret")
			}
			if err := v.Verify(r); err != nil {
				t.Fatalf("a signed request: %v", err)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil || string(got) != tc.want {
				t.Fatalf("body read through the verifier: %d bytes, %v; want the %d sent", len(got), err, len(tc.want))
			}
		})
	}
	r := serverSide(t, signed(t, a, http.MethodGet, "http://node/fleet/v1/snapshots/x", nil, time.Now()))
	if err := NewVerifier("another-secret-0123456789").Verify(r); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("verified with another secret: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A captured header is good for its own request, once: replayed as it
// was, or on another body, query, host, path, method or routing header,
// or outside the clock window, it is refused before anything is read.
func TestRPCAuthRefusesReplaysAndChanges(t *testing.T) {
	a := NewAuth(testSecret)
	const url = "http://node:3100/fleet/v1/node.v1.NodeService/Kill?sandbox=a"
	orig := signed(t, a, http.MethodPost, url, strings.NewReader(`{"id":"alice-sandbox"}`), time.Now())
	v := NewVerifier(testSecret)
	if err := v.Verify(serverSide(t, orig)); err != nil {
		t.Fatalf("the original request: %v", err)
	}
	hdr := serverSide(t, orig).Header.Get(AuthHeader)
	with := func(method, url, body string, set func(r *http.Request)) *http.Request {
		r, _ := http.NewRequest(method, url, strings.NewReader(body))
		if body == "" {
			r.Body = http.NoBody
		}
		r.Header.Set(AuthHeader, hdr)
		if set != nil {
			set(r)
		}
		return wire(t, r)
	}
	for _, tc := range []struct {
		name string
		r    *http.Request
	}{
		{"the same request again", serverSide(t, orig)},
		{"another body", with(http.MethodPost, url, `{"id":"bob-sandbox"}`, nil)},
		{"no body", with(http.MethodPost, url, "", nil)},
		{"another query", with(http.MethodPost, "http://node:3100/fleet/v1/node.v1.NodeService/Kill?sandbox=b", `{"id":"alice-sandbox"}`, nil)},
		{"another host", with(http.MethodPost, "http://other-node:3100/fleet/v1/node.v1.NodeService/Kill?sandbox=a", `{"id":"alice-sandbox"}`, nil)},
		{"another path", with(http.MethodPost, "http://node:3100/fleet/v1/node.v1.NodeService/Pause?sandbox=a", `{"id":"alice-sandbox"}`, nil)},
		{"another method", with(http.MethodPut, url, `{"id":"alice-sandbox"}`, nil)},
		{"another sandbox header", with(http.MethodPost, url, `{"id":"alice-sandbox"}`, func(r *http.Request) { r.Header.Set("E2b-Sandbox-Id", "bob") })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh verifier but for the replay: a change is refused
			// by the MAC, not because the nonce was used.
			vv := NewVerifier(testSecret)
			if tc.name == "the same request again" {
				vv = v
			}
			if err := vv.Verify(tc.r); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Fatalf("got %v, want a refusal (unauthenticated)", err)
			}
		})
	}
	for _, d := range []time.Duration{-Skew - 2*time.Second, Skew + 2*time.Second} {
		r := serverSide(t, signed(t, a, http.MethodGet, "http://node/fleet/v1/snapshots/x", nil, time.Now().Add(d)))
		if err := NewVerifier(testSecret).Verify(r); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("a header made %s from now: got %v, want a refusal", d, err)
		}
	}
}

// A streamed body passes on only chunks that verified: an altered chunk
// fails the read before its bytes are handed on; a body cut short, or
// one without its end mark, ends with an error, not a clean end.
func TestRPCAuthStreamedBody(t *testing.T) {
	a := NewAuth(testSecret)
	first, second := bytes.Repeat([]byte{'a'}, 100), bytes.Repeat([]byte{'b'}, 100)
	raw := signed(t, a, http.MethodPost, "http://node/fleet/v1/build", io.MultiReader(bytes.NewReader(first), bytes.NewReader(second)), time.Now())
	// The framed body, as the chunked encoding carried it.
	framed, err := io.ReadAll(serverSide(t, raw).Body)
	if err != nil {
		t.Fatal(err)
	}
	frame := 4 + 32
	if want := 3*frame + len(first) + len(second); len(framed) != want {
		t.Fatalf("framed body of %d bytes, want %d (two chunks and the end mark)", len(framed), want)
	}
	hdr := serverSide(t, raw).Header.Get(AuthHeader)
	send := func(body []byte) (got []byte, err error) {
		r, _ := http.NewRequest(http.MethodPost, "http://node/fleet/v1/build", io.NopCloser(bytes.NewReader(body)))
		r.ContentLength = -1
		r.Header.Set(AuthHeader, hdr)
		sr := wire(t, r)
		if err := NewVerifier(testSecret).Verify(sr); err != nil {
			return nil, err
		}
		return io.ReadAll(sr.Body)
	}
	if got, err := send(framed); err != nil || !bytes.Equal(got, append(slicesClone(first), second...)) {
		t.Fatalf("the framed body as sent: %q, %v", got, err)
	}
	altered := slicesClone(framed)
	altered[2*frame+len(first)+5] ^= 1 // a byte of the second chunk
	swapped := slicesClone(framed)
	copy(swapped[frame:], second) // the first chunk's bytes replaced, MAC kept
	long := binary.BigEndian.AppendUint32(nil, maxChunk+1)
	for _, tc := range []struct {
		name     string
		body     []byte
		upTo     []byte // what may be handed on before the error
		notClean bool   // only an error, of any class, is wanted
	}{
		{name: "a chunk altered", body: altered, upTo: first},
		{name: "a chunk's bytes replaced", body: swapped},
		{name: "the second chunk dropped", body: append(slicesClone(framed[:frame+len(first)]), framed[2*frame+len(first)+len(second):]...), upTo: first},
		{name: "the end mark dropped", body: framed[:2*frame+len(first)+len(second)], upTo: append(slicesClone(first), second...), notClean: true},
		{name: "cut in a chunk", body: framed[:frame+50], notClean: true},
		{name: "an unframed body", body: []byte("plain bytes of another body, not framed at all, long enough"), notClean: true},
		{name: "a chunk longer than any sender makes", body: append(long, make([]byte, 32)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := send(tc.body)
			if err == nil {
				t.Fatalf("read %d bytes and a clean end, want an error", len(got))
			}
			if !tc.notClean && !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Errorf("got %v, want unauthenticated", err)
			}
			if !bytes.HasPrefix(tc.upTo, got) {
				t.Errorf("handed on %q before the error: more than what verified", got)
			}
		})
	}
}

func slicesClone(b []byte) []byte { return append([]byte(nil), b...) }

// The replay cache is bounded: full, it refuses (unavailable) rather
// than grow; a second out of the window is forgotten, and its room
// given to new requests.
func TestReplayCacheBounded(t *testing.T) {
	a := NewAuth(testSecret)
	v := NewVerifier(testSecret)
	now := time.Unix(1_800_000_000, 0)
	v.now = func() time.Time { return now }
	v.max = 3
	get := func() *http.Request {
		return serverSide(t, signed(t, a, http.MethodGet, "http://node/fleet/v1/snapshots/x", nil, now))
	}
	for i := range 3 {
		if err := v.Verify(get()); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if err := v.Verify(get()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a 4th request with room for 3: got %v, want unavailable", err)
	}
	now = now.Add(Skew + time.Second)
	if err := v.Verify(get()); err != nil {
		t.Fatalf("once the first three are out of the window: %v", err)
	}
	if v.n != 1 {
		t.Fatalf("the cache holds %d nonces, want 1 (the expired ones dropped)", v.n)
	}
}

// Many callers at once: each signed request, sent by two goroutines at
// the same time, is accepted exactly once and refused as a replay once.
func TestVerifierConcurrent(t *testing.T) {
	a, v := NewAuth(testSecret), NewVerifier(testSecret)
	const workers, each = 8, 50
	raws := make([][]byte, workers*each)
	for i := range raws {
		raws[i] = signed(t, a, http.MethodPost, "http://node/fleet/v1/x", strings.NewReader("body"), time.Now())
	}
	var accepted, replays [workers * each]atomic.Int32
	var wg sync.WaitGroup
	for w := range 2 * workers {
		wg.Go(func() {
			// Workers w and w+workers send the same requests.
			for i := (w % workers) * each; i < (w%workers+1)*each; i++ {
				r, _ := http.ReadRequest(bufio.NewReader(bytes.NewReader(raws[i])))
				switch err := v.Verify(r); {
				case err == nil:
					accepted[i].Add(1)
				case errors.Is(err, errdefs.ErrUnauthenticated):
					replays[i].Add(1)
				default:
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for i := range raws {
		if a, r := accepted[i].Load(), replays[i].Load(); a != 1 || r != 1 {
			t.Fatalf("request %d: accepted %d times, refused %d, want once each", i, a, r)
		}
	}
}
