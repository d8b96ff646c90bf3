package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentenv/agentenv/client/api"
)

// ListTemplates lists templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out []Template
	err := c.do(ctx, http.MethodGet, "/templates", nil, &out)
	return out, err
}

// GetTemplate returns one template.
func (c *Client) GetTemplate(ctx context.Context, name string) (Template, error) {
	var t Template
	err := c.do(ctx, http.MethodGet, "/templates/"+url.PathEscape(name), nil, &t)
	return t, err
}

// DeleteTemplate deletes a template.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(name), nil, nil)
}

// BuildTemplate builds a template, calling progress for each step.
func (c *Client) BuildTemplate(ctx context.Context, req BuildRequest, progress func(BuildProgress)) (Template, error) {
	resp, err := c.send(ctx, http.MethodPost, "/agentenv/templates", req)
	if err != nil {
		return Template{}, err
	}
	return readBuildStream(resp, progress)
}

// UploadTemplate builds a template from a rootfs tar stream (plain or
// gzip), calling progress for each step.
func (c *Client) UploadTemplate(ctx context.Context, name string, tarball io.Reader, progress func(BuildProgress)) (Template, error) {
	return c.UploadTemplateWith(ctx, BuildRequest{Name: name}, tarball, progress)
}

// UploadTemplateWith is UploadTemplate with the image label and settings
// of b (its source fields are not used).
func (c *Client) UploadTemplateWith(ctx context.Context, b BuildRequest, tarball io.Reader, progress func(BuildProgress)) (Template, error) {
	q := url.Values{}
	for k, v := range map[string]string{"image": b.Image, "workdir": b.Workdir, "user": b.User, "startCmd": b.StartCmd, "readyCmd": b.ReadyCmd} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for k, v := range map[string]int{"diskMB": b.DiskMB, "cpuCount": b.CPUCount, "memoryMB": b.MemoryMB} {
		if v != 0 {
			q.Set(k, strconv.Itoa(v))
		}
	}
	if b.ReadyTimeout != 0 {
		q.Set("readyTimeout", fmt.Sprint(b.ReadyTimeout))
	}
	for k, v := range b.Env {
		q.Add("env", k+"="+v)
	}
	u := c.API + "/agentenv/templates/" + url.PathEscape(b.Name) + "/rootfs"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, tarball)
	if err != nil {
		return Template{}, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.roundTrip(req)
	if err != nil {
		return Template{}, err
	}
	return readBuildStream(resp, progress)
}

func readBuildStream(resp *http.Response, progress func(BuildProgress)) (Template, error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return Template{}, fmt.Errorf("bad build stream line: %w", err)
		}
		switch {
		case ev.Progress != nil:
			progress(*ev.Progress)
		case ev.Error != nil:
			return Template{}, ev.Error
		case ev.Template != nil:
			return *ev.Template, nil
		}
	}
	if err := sc.Err(); err != nil {
		return Template{}, err
	}
	return Template{}, fmt.Errorf("build stream ended without a result")
}

// BuildSteps builds template name from steps (E2B's v3 build: a request,
// then its start) and waits until the build ends; it returns the template
// or why the build failed.
func (c *Client) BuildSteps(ctx context.Context, name string, start api.TemplateBuildStartV2) (Template, error) {
	var req api.TemplateRequestResponseV3
	if err := c.do(ctx, http.MethodPost, "/v3/templates", api.TemplateBuildRequestV3{Name: name}, &req); err != nil {
		return Template{}, err
	}
	if err := c.do(ctx, http.MethodPost, "/v2/templates/"+url.PathEscape(name)+"/builds/"+url.PathEscape(req.BuildID), start, nil); err != nil {
		return Template{}, err
	}
	for {
		var info api.TemplateBuildInfo
		if err := c.do(ctx, http.MethodGet, "/templates/"+url.PathEscape(name)+"/builds/"+url.PathEscape(req.BuildID)+"/status", nil, &info); err != nil {
			return Template{}, err
		}
		switch info.Status {
		case "ready":
			return c.GetTemplate(ctx, name)
		case "error":
			msg := "no reason given"
			if info.Reason != nil {
				msg = info.Reason.Message
			}
			return Template{}, fmt.Errorf("build of template %s failed: %s", name, msg)
		}
		select {
		case <-ctx.Done():
			return Template{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
