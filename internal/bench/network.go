package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The network rows: one sandbox serves files with busybox httpd, the host
// fetches them through the proxy and uploads to envd through it.
const (
	httpPort     = 8080
	smallSize    = 100 // bytes of the page the latency row fetches
	netMiB       = 64  // MiB per throughput transfer
	netTransfers = 3   // transfers per throughput row
)

// Bandwidth is a throughput row: transfers of MiB each.
type Bandwidth struct {
	N   int     `json:"n"`
	MiB float64 `json:"mib"`
	// MedianMiBps is MiB over the nearest-rank median transfer time; Min
	// and Max come from the slowest and fastest transfer.
	MedianMiBps float64 `json:"median_mibps"`
	MinMiBps    float64 `json:"min_mibps"`
	MaxMiBps    float64 `json:"max_mibps"`
}

// summarizeBandwidth turns the times of transfers of mib MiB each into
// rates. An empty input gives zero Bandwidth.
func summarizeBandwidth(mib float64, times []time.Duration) Bandwidth {
	if len(times) == 0 {
		return Bandwidth{}
	}
	s := slices.Clone(times)
	slices.Sort(s)
	rate := func(d time.Duration) float64 {
		if d <= 0 {
			return 0
		}
		return mib / d.Seconds()
	}
	return Bandwidth{
		N: len(s), MiB: mib,
		MedianMiBps: rate(Percentile(s, 50)),
		MinMiBps:    rate(s[len(s)-1]),
		MaxMiBps:    rate(s[0]),
	}
}

// network measures, on agentenv only (the raw targets have no proxy): a
// small GET to a server in a sandbox through the proxy, and 64 MiB down
// from that server and up to envd's /files.
func (r *runner) network(ctx context.Context) (err error) {
	t := r.ts.agentenv
	r.progressf("network: booting a sandbox with httpd on port %d and a %d MiB file", httpPort, netMiB)
	id, err := t.boot(ctx, 0)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	defer func() {
		if kerr := killAll(ctx, t, []string{id}); kerr != nil {
			err = errors.Join(err, fmt.Errorf("kill %s: %w", id, kerr))
		}
	}()
	// httpd daemonizes; its output goes to /dev/null or the exec stream
	// would stay open (docs/traps.md).
	script := fmt.Sprintf("mkdir -p /tmp/www && printf %%s %s > /tmp/www/index.html && "+
		"dd if=/dev/urandom of=/tmp/www/big bs=1M count=%d 2>/dev/null && "+
		"httpd -p %d -h /tmp/www >/dev/null 2>&1", strings.Repeat("x", smallSize), netMiB, httpPort)
	if err := t.sh(ctx, id, script); err != nil {
		return fmt.Errorf("start httpd: %w", err)
	}
	// One keep-alive connection to the proxy, as a browser or SDK would
	// hold; busybox httpd itself closes each connection.
	tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
	defer tr.CloseIdleConnections()
	sg := sandboxGetter{hc: &http.Client{Transport: tr}, url: r.cfg.Client.Proxy, id: id}
	if err := sg.waitReady(ctx); err != nil {
		return err
	}
	get := step{TargetAgentenv, func(ctx context.Context) (map[Operation]time.Duration, error) {
		start := time.Now()
		n, err := sg.get(ctx, "/index.html")
		if err != nil {
			return nil, err
		}
		d := time.Since(start)
		if n != smallSize {
			return nil, fmt.Errorf("GET /index.html: got %d bytes, want %d", n, smallSize)
		}
		return map[Operation]time.Duration{OpProxyGet: d}, nil
	}}
	if err := r.rounds(ctx, "network: small GET through the proxy", r.cfg.Iterations, r.cfg.Warmup, []step{get}); err != nil {
		return err
	}
	r.rep.Notes = append(r.rep.Notes, fmt.Sprintf("network: agentenv only; busybox httpd on port %d in one sandbox (it closes each connection; the host keeps one to the proxy), %d-byte page; %d MiB from httpd, %d MiB up to envd's /files", httpPort, smallSize, netMiB, netMiB))
	down, err := r.download(ctx, sg)
	if err != nil {
		return err
	}
	r.setBandwidth(OpProxyDown, down)
	up, err := r.upload(ctx, id)
	if err != nil {
		return err
	}
	r.setBandwidth(OpProxyUp, up)
	return nil
}

func (r *runner) setBandwidth(op Operation, times []time.Duration) {
	if r.rep.Bandwidth == nil {
		r.rep.Bandwidth = map[string]map[Operation]Bandwidth{}
	}
	if r.rep.Bandwidth[TargetAgentenv] == nil {
		r.rep.Bandwidth[TargetAgentenv] = map[Operation]Bandwidth{}
	}
	r.rep.Bandwidth[TargetAgentenv][op] = summarizeBandwidth(netMiB, times)
}

// download fetches the big file through the proxy netTransfers times and
// checks each byte count.
func (r *runner) download(ctx context.Context, sg sandboxGetter) ([]time.Duration, error) {
	r.progressf("network: %d downloads of %d MiB through the proxy", netTransfers, netMiB)
	var times []time.Duration
	for i := range netTransfers {
		start := time.Now()
		n, err := sg.get(ctx, "/big")
		if err != nil {
			return nil, fmt.Errorf("download %d: %w", i+1, err)
		}
		times = append(times, time.Since(start))
		if n != netMiB<<20 {
			return nil, fmt.Errorf("download %d: got %d bytes, want %d", i+1, n, netMiB<<20)
		}
	}
	return times, nil
}

// upload writes netMiB MiB to a file in the sandbox through the proxy and
// envd netTransfers times, then checks the file's size.
func (r *runner) upload(ctx context.Context, id string) ([]time.Duration, error) {
	t := r.ts.agentenv
	// The sandbox's files live in its memory: drop the download's file.
	if err := t.sh(ctx, id, "rm -f /tmp/www/big"); err != nil {
		return nil, err
	}
	r.progressf("network: %d uploads of %d MiB through the proxy", netTransfers, netMiB)
	data := make([]byte, netMiB<<20)
	rand.Read(data)
	const path = "/tmp/agentenv-bench-upload"
	var times []time.Duration
	for i := range netTransfers {
		start := time.Now()
		if err := r.cfg.Client.WriteFile(ctx, t.sandbox(id), path, bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("upload %d: %w", i+1, err)
		}
		times = append(times, time.Since(start))
	}
	if err := t.sh(ctx, id, fmt.Sprintf("test $(wc -c < %s) -eq %d", path, len(data))); err != nil {
		return nil, fmt.Errorf("uploaded file has the wrong size: %w", err)
	}
	return times, nil
}

// sandboxGetter sends GETs to one port of one sandbox through the proxy,
// routed by the E2B headers.
type sandboxGetter struct {
	hc  *http.Client
	url string // the proxy's base URL
	id  string
}

// get fetches path and returns how many body bytes came; anything but 200
// is an error.
func (g sandboxGetter) get(ctx context.Context, path string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("E2b-Sandbox-Id", g.id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(httpPort))
	resp, err := g.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, bytes.TrimSpace(b))
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return n, fmt.Errorf("GET %s: %w", path, err)
	}
	return n, nil
}

// waitReady polls until httpd answers: it may not listen yet when the
// command that started it returns.
func (g sandboxGetter) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := g.get(ctx, "/index.html")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("httpd in the sandbox did not answer within 10s: %w", err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
