package cli

import (
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/template"
)

// imageFlags are template build's OCI image sources and process settings.
type imageFlags struct {
	oci, ref string
	env      []string
	client.TemplateSettings
}

func (f *imageFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.oci, "oci", "", "OCI image layout directory or `docker save` tarball on this machine: its layers are flattened here and uploaded")
	fl.StringVar(&f.ref, "image", "", "image in a registry (e.g. docker.io/library/alpine:3.20), pulled on this machine and uploaded")
	fl.StringArrayVar(&f.env, "env", nil, "KEY=VALUE for every process in the template's sandboxes (repeat; adds to an image's Env)")
	fl.StringVar(&f.Workdir, "workdir", "", "default working directory of commands (default: the image's WorkingDir, else the user's home)")
	fl.StringVar(&f.User, "user", "", "default user of commands (default: the image's User, else \"user\")")
	fl.StringVar(&f.StartCmd, "start-cmd", "", "shell command started when the template boots; every sandbox starts with it running")
	fl.StringVar(&f.ReadyCmd, "ready-cmd", "", "shell command that exits 0 once --start-cmd is ready (default: ready after it ran 1 s)")
	fl.IntVar(&f.ReadyTimeout, "ready-timeout", 0, "seconds to wait for --ready-cmd (default 60)")
}

// settings puts the flags' settings into req.
func (f *imageFlags) settings(req *client.BuildRequest) error {
	req.TemplateSettings = f.TemplateSettings
	env, err := parsePairs(f.env, "--env")
	if err != nil {
		return err
	}
	for k, v := range env {
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	return nil
}

// open reads the image, fills req's settings the flags left unset from the
// image's config, and returns its flattened filesystem as a tar stream.
func (f *imageFlags) open(cmd *cobra.Command, req *client.BuildRequest) (io.ReadCloser, error) {
	var img v1.Image
	var err error
	if f.ref != "" {
		req.Image = f.ref
		img, err = template.PullImage(cmd.Context(), f.ref)
	} else {
		req.Image = f.oci
		img, err = template.OpenOCI(f.oci)
	}
	if err != nil {
		return nil, err
	}
	d, err := template.ImageDefaults(img)
	if err != nil {
		return nil, err
	}
	if req.Workdir == "" {
		req.Workdir = d.Workdir
	}
	if req.User == "" {
		req.User = d.User
	}
	for k, v := range d.Env {
		if _, set := req.Env[k]; !set {
			if req.Env == nil {
				req.Env = map[string]string{}
			}
			req.Env[k] = v
		}
	}
	return template.FlattenImage(img), nil
}
