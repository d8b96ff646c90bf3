package cli

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// usageError is a command line the CLI cannot run: an unknown command, a
// bad flag, the wrong number of arguments. Main prints it with its hint
// and exits with status 2, so that `ID=$(agentenv sandbox crate base)`
// fails rather than capturing help.
type usageError struct {
	err  error
	cmd  *cobra.Command
	hint string
	// dashDash: an unknown flag of a passesCommand command, which Main
	// answers with the command line rewritten.
	dashDash bool
}

func (e *usageError) Error() string {
	if e.hint == "" {
		return e.err.Error()
	}
	return e.err.Error() + "\n" + e.hint
}

func (e *usageError) Unwrap() error { return e.err }

// passesCommand marks commands whose arguments after the sandbox ID are a
// command line of their own (exec): a flag error there gets a hint at `--`.
const passesCommand = "agentenv/passes-command"

const dashDashHint = "flags after the sandbox ID are agentenv's: put the command after `--`, as in\n  "

// strict makes every command of the tree answer a command line it cannot
// run with a usageError: groups refuse unknown subcommands (suggesting the
// nearest), every command wrong flags and argument counts.
func strict(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		ue := &usageError{err: err, cmd: c}
		var unknown interface{ GetSpecifiedName() string }
		if c.Annotations[passesCommand] != "" && errors.As(err, &unknown) {
			ue.dashDash = true
			ue.hint = dashDashHint + c.CommandPath() + " ID -- COMMAND [ARGS...]"
		}
		return ue
	})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch {
		case c.HasSubCommands() && !c.Runnable():
			c.Args = cobra.ArbitraryArgs
			c.RunE = unknownCommand
		case c.Args != nil:
			check := c.Args
			c.Args = func(c *cobra.Command, args []string) error {
				if err := check(c, args); err != nil {
					return &usageError{err: err, cmd: c, hint: fmt.Sprintf("usage: %s (see `%s --help`)", c.UseLine(), c.CommandPath())}
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// unknownCommand runs a group: help without arguments, else the error of
// an unknown subcommand with the nearest names.
func unknownCommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return c.Help()
	}
	ue := &usageError{err: fmt.Errorf("unknown command %q for %q", args[0], c.CommandPath()), cmd: c,
		hint: fmt.Sprintf("run `%s --help` for its commands", c.CommandPath())}
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's default, set only on its own path
	}
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		ue.hint = "did you mean " + strings.Join(s, " or ") + "?"
	}
	return ue
}

// dashDashLine rewrites the command line args of a passesCommand command
// with `--` after the sandbox ID, when it can tell where the ID is.
func dashDashLine(c *cobra.Command, args []string) string {
	i := slices.Index(args, c.Name())
	if i < 0 || slices.Contains(args, "--") {
		return ""
	}
	rest := args[i+1:]
	j := 0 // the ID's index in rest: after agentenv's own flags
	for j < len(rest) && strings.HasPrefix(rest[j], "-") {
		name, _, withValue := strings.Cut(strings.TrimLeft(rest[j], "-"), "=")
		f := c.Flags().Lookup(name)
		if !strings.HasPrefix(rest[j], "--") {
			f = nil
			if len(name) == 1 {
				f = c.Flags().ShorthandLookup(name)
			}
		}
		if f == nil {
			return "" // not agentenv's: the ID's place is unknown
		}
		takesValue := f.Value.Type() != "bool"
		j++
		if takesValue && !withValue {
			j++
		}
	}
	if j >= len(rest)-1 {
		return ""
	}
	line := strings.Fields(c.CommandPath())
	for k := 0; k <= j; k++ {
		a := rest[k]
		switch {
		case a == "--api-key" && k < j:
			line = append(line, a, "KEY") // never echo a secret
			k++
			continue
		case strings.HasPrefix(a, "--api-key="):
			a = "--api-key=KEY"
		}
		line = append(line, a)
	}
	line = append(line, "--")
	line = append(line, rest[j+1:]...)
	for k, a := range line {
		line[k] = shellQuote(a)
	}
	return strings.Join(line, " ")
}

// shellQuote quotes a for a POSIX shell when it needs it.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,+%") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
