package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// sandboxCp copies files and directories between this machine and a
// sandbox, as `docker cp` does, through envd's file API.
func sandboxCp(g *globals) *cobra.Command {
	var user string
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between this machine and a sandbox (ID:PATH names the sandbox side)",
		Long: "Copies a file or a directory tree between this machine and a sandbox; one of SRC and DST is\n" +
			"ID:PATH. A DST that is a directory (or ends in /) receives SRC under its own name; otherwise\n" +
			"DST becomes the copy. Files are streamed through envd; symlinks and special files are skipped\n" +
			"(with a warning). Files copied into the sandbox get mode 0644; copied out, they keep theirs.",
		Example: "  agentenv sandbox cp ./data ID:/home/user/data\n  agentenv sandbox cp ID:/home/user/results.json .",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcID, src, srcRemote := remotePath(args[0])
			dstID, dst, dstRemote := remotePath(args[1])
			switch {
			case srcRemote == dstRemote && srcRemote:
				return &usageError{err: errors.New("both SRC and DST are in sandboxes: copy to this machine first"), cmd: cmd}
			case srcRemote == dstRemote:
				return &usageError{err: errors.New("neither SRC nor DST is in a sandbox: write one as ID:PATH"), cmd: cmd}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			id := srcID + dstID
			sb, err := c.GetSandbox(cmd.Context(), id)
			if err != nil {
				return err
			}
			warn := func(msg string) { fmt.Fprintln(cmd.ErrOrStderr(), "warning:", msg) }
			files := c.Files(sb, user)
			if srcRemote {
				return files.CopyFrom(cmd.Context(), src, dst, warn)
			}
			return files.CopyTo(cmd.Context(), src, dst, warn)
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user that reads or writes the files in the sandbox (default: the sandbox's default user)")
	return cmd
}

// remotePath splits "ID:PATH" (docker cp's syntax). A local path with a
// colon is written with a slash before it ("./a:b").
func remotePath(arg string) (id, path string, ok bool) {
	id, path, ok = strings.Cut(arg, ":")
	if !ok || id == "" || strings.ContainsAny(id, `/\`) || strings.HasPrefix(id, ".") {
		return "", arg, false
	}
	if path == "" {
		path = "."
	}
	return id, path, true
}
