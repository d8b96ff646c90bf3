package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentenv/agentenv/client"
	"github.com/agentenv/agentenv/internal/template"
)

func templateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Aliases: []string{"tpl"}, Short: "Build, list and delete templates"}
	cmd.AddCommand(templateBuild(g), templateList(g), templateDelete(g))
	return cmd
}

func templateBuild(g *globals) *cobra.Command {
	var req client.BuildRequest
	var packages, upload string
	var img imageFlags
	var codeInterp bool
	cmd := &cobra.Command{
		Use:   "build NAME (--debian SUITE [--packages a,b] | --rootfs DIR|TARBALL | --import PATH | --oci PATH | --image REF) [--start-cmd CMD [--ready-cmd CMD]]",
		Short: "Build a template on the server, showing progress",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req.Name = args[0]
			if packages != "" {
				req.Packages = strings.Split(packages, ",")
			}
			if codeInterp {
				// E2B's code interpreter template: Debian with Python's
				// kernel and data libraries, the server as its start command.
				if req.Rootfs != "" || upload != "" || img.oci != "" || img.ref != "" {
					return fmt.Errorf("--code-interpreter builds from Debian: leave out --rootfs, --import, --oci and --image")
				}
				if req.Debian == "" {
					req.Debian = "bookworm"
				}
				req.CodeInterpreter = true
				req.Packages = append(slices.Clone(template.CodeInterpreterPackages), req.Packages...)
			}
			if err := img.settings(&req); err != nil {
				return err
			}
			var tarball io.Reader
			sources := 0
			for _, s := range []string{req.Debian, req.Rootfs, upload, img.oci, img.ref} {
				if s != "" {
					sources++
				}
			}
			if sources > 1 {
				return fmt.Errorf("give one source: --debian, --rootfs, --import, --oci or --image")
			}
			if upload != "" {
				r, err := template.OpenRootfs(cmd.Context(), upload)
				if err != nil {
					return fmt.Errorf("--rootfs: %w", err)
				}
				defer r.Close()
				tarball = r
			}
			if img.oci != "" || img.ref != "" {
				r, err := img.open(cmd, &req)
				if err != nil {
					return err
				}
				defer r.Close()
				tarball = r
			}
			bar := newBuildProgress(cmd.ErrOrStderr(), req.Name, g.json)
			var t client.Template
			if tarball != nil {
				t, err = c.UploadTemplateWith(cmd.Context(), req, tarball, bar.show)
			} else {
				t, err = c.BuildTemplate(cmd.Context(), req, bar.show)
			}
			bar.finish()
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "built template %s (%s, image %.1f MiB): %s\n", t.TemplateID, t.Source, float64(t.ImageSize)/(1<<20), startWord(t, true))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Debian, "debian", "", "Debian suite to debootstrap (e.g. bookworm)")
	f.StringVar(&packages, "packages", "", "comma-separated Debian packages to include")
	f.BoolVar(&codeInterp, "code-interpreter", false, "build E2B's code interpreter template (name it code-interpreter-v1, the SDKs' default): Debian (--debian, default bookworm) with python3, ipykernel, numpy, pandas, matplotlib and --packages, serving runCode on port 49999")
	f.StringVar(&upload, "rootfs", "", "root filesystem directory or tarball (.tar, .tar.gz) on this machine, uploaded to the server")
	f.StringVar(&req.Rootfs, "import", "", "root filesystem directory or tarball inside the server's --import-dir")
	img.register(cmd)
	f.IntVar(&req.DiskMB, "disk-mb", 0, "size in MiB of each sandbox's write layer (0: the server's --disk-mb)")
	f.IntVar(&req.CPUCount, "cpus", 0, "CPUs of each sandbox that asks for none (0: the server's --default-cpus)")
	f.IntVar(&req.MemoryMB, "memory-mb", 0, "memory in MiB of each sandbox that asks for none (0: the server's --default-memory-mb)")
	return cmd
}

func templateList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return g.printJSON(cmd.OutOrStdout(), ts)
			}
			rows := [][]string{}
			for _, t := range ts {
				disk := "default"
				if t.DiskSizeMB > 0 {
					disk = fmt.Sprintf("%d MiB", t.DiskSizeMB)
				}
				rows = append(rows, []string{t.TemplateID, t.Source, fmt.Sprintf("%.1f MiB", float64(t.ImageSize)/(1<<20)),
					mib(t.OwnBytes), mib(t.SharedBytes), fmt.Sprint(max(t.Layers, 1)), disk,
					fmt.Sprint(t.InUse), startWord(t, false), t.CreatedAt.Local().Format("2006-01-02 15:04")})
			}
			table(cmd.OutOrStdout(), "NAME\tSOURCE\tIMAGE\tOWN\tSHARED\tLAYERS\tDISK\tIN USE\tSTART\tCREATED", rows)
			return nil
		},
	}
}

// mib writes a byte count in MiB for the template table.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// startWord says how the template's sandboxes start: "snapshot" when the
// server restores a snapshot of it booted once (the API's ready: fast
// creates), else "boot". Every template listed can create sandboxes; the
// column used to read READY false for all of them on a server without
// --ready-templates, though their builds had said "ready".
func startWord(t client.Template, long bool) string {
	switch {
	case t.Ready && long:
		return "sandboxes start from a snapshot of it booted once"
	case t.Ready:
		return "snapshot"
	case long:
		return "sandboxes boot it (agentenv serve --ready-templates restores a snapshot instead: faster)"
	}
	return "boot"
}

func templateDelete(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a template no sandbox uses (the server's warm containers of it go with it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteTemplate(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "deleted", args[0])
			return nil
		},
	}
}
