package api

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/internal/service"
	"github.com/agentenv/agentenv/internal/template"
)

// uploadBackend reads an upload the way the template store does and
// stops at the tar's end.
type uploadBackend struct{ service.Backend }

func (uploadBackend) BuildTemplate(ctx context.Context, req template.BuildRequest, progress func(template.Progress)) (service.TemplateInfo, error) {
	tr := tar.NewReader(req.Upload)
	for {
		if _, err := tr.Next(); err == io.EOF {
			break
		} else if err != nil {
			return service.TemplateInfo{}, err
		}
	}
	progress(template.Progress{Phase: "rootfs", Percent: 50})
	return service.TemplateInfo{Template: template.Template{Name: req.Name}}, nil
}

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// A tar padded past its end (Python's tarfile pads to 10 KiB) must not
// break the connection for the next request on it.
func TestUploadWithTrailingPaddingKeepsConnection(t *testing.T) {
	var logs logBuf
	srv := httptest.NewUnstartedServer(New(Config{APIKey: "k", Backend: uploadBackend{}}).Handler())
	srv.Config.ErrorLog = log.New(&logs, "", 0)
	srv.Start()
	defer srv.Close()

	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "a", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	tb.Write(make([]byte, 10240-tb.Len()%10240+10240))

	c := srv.Client()
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/agentenv/templates/t/rootfs", bytes.NewReader(tb.Bytes()))
		req.Header.Set("X-API-Key", "k")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"templateID":"t"`) {
			t.Fatalf("upload %d: HTTP %d %s", i, resp.StatusCode, body)
		}
		hr, err := c.Get(srv.URL + "/health")
		if err != nil {
			t.Fatalf("health after upload %d: %v", i, err)
		}
		hr.Body.Close()
	}
	if s := logs.b.String(); strings.Contains(s, "panic") {
		t.Fatalf("server panicked:\n%s", s)
	}
}

// An upload's cpuCount and memoryMB (the legacy build's sizes of the
// template's sandboxes) reach the build request; a bad number is refused.
func TestUploadRequestSize(t *testing.T) {
	r := httptest.NewRequest("POST", "/agentenv/templates/t/rootfs?cpuCount=1&memoryMB=1024&diskMB=256", nil)
	r.SetPathValue("name", "t")
	req, err := uploadRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := (template.Size{CPUs: 1, MemoryMB: 1024}); req.Size != want || req.DiskMB != 256 {
		t.Errorf("got size %+v, diskMB %d; want %+v, 256", req.Size, req.DiskMB, want)
	}
	r = httptest.NewRequest("POST", "/agentenv/templates/t/rootfs?memoryMB=lots", nil)
	if _, err := uploadRequest(r); err == nil || !strings.Contains(err.Error(), "memoryMB") {
		t.Errorf("memoryMB=lots: got %v, want an error naming memoryMB", err)
	}
}
