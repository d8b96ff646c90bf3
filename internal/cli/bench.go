package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

func benchCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox operations against raw runsc and crun",
		RunE: func(cmd *cobra.Command, args []string) error {
			return errors.New("not implemented yet")
		},
	}
}
