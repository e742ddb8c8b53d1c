// Package cli is what the project's command-line tools share so that they
// behave alike: a cobra command tree run with help on stdout, errors that
// name the fix (an unknown flag says which command it belongs to), group
// commands that refuse unknown subcommands, and the zap logger of a command
// (colour only on a terminal). Only the commands under cmd/
// (cmd/cellvisor, cmd/cellvisor-control, cmd/cellvisor-demo) import it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"
)

// ErrNoCommand is returned when a command that needs a subcommand got none;
// the usage went to stderr.
var ErrNoCommand = errors.New("no command given")

// Execute runs root with args: help (--help, -h, help COMMAND) goes to
// stdout and returns nil; every error is returned, not printed, for main to
// print once.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) error {
	Prepare(root)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if args == nil {
		root.SetArgs([]string{}) // nil would make cobra read os.Args
	}
	return root.ExecuteContext(ctx)
}

// Prepare sets the shared behaviour on root and every command below it.
func Prepare(root *cobra.Command) {
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(flagError)
	walk(root, func(c *cobra.Command) {
		if c.HasSubCommands() && c.Run == nil && c.RunE == nil {
			c.RunE = group
		}
	})
}

func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, sub := range c.Commands() {
		walk(sub, f)
	}
}

// group runs a command that only holds subcommands: with none named it
// prints its usage to stderr and fails; with an unknown one it says so.
func group(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unknown command %q for %q (see %s --help)", args[0], c.CommandPath(), c.CommandPath())
	}
	c.SetOut(c.ErrOrStderr())
	_ = c.Usage()
	return fmt.Errorf("%w: %s needs one (see %s --help)", ErrNoCommand, c.CommandPath(), c.CommandPath())
}

// flagError makes a flag error name the fix: an unknown flag says which
// commands take it, any other points at the command's help.
func flagError(c *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) {
		return fmt.Errorf("%s: %w (see %s --help)", c.CommandPath(), err, c.CommandPath())
	}
	// For a shorthand, the name is the one letter not known.
	name, short := ne.GetSpecifiedName(), ne.GetSpecifiedShortnames() != ""
	flag := "--" + name
	if short {
		flag = "-" + name
	}
	var owners []string
	walk(c.Root(), func(o *cobra.Command) {
		if o == c || o.Hidden {
			return
		}
		fs := o.LocalNonPersistentFlags()
		if (short && fs.ShorthandLookup(name) != nil) || (!short && fs.Lookup(name) != nil) {
			owners = append(owners, fmt.Sprintf("%q", o.CommandPath()))
		}
	})
	if len(owners) == 0 {
		return fmt.Errorf("unknown flag %s for %q: see %s --help for its flags", flag, c.CommandPath(), c.CommandPath())
	}
	return fmt.Errorf("unknown flag %s for %q: it belongs to %s (see %s --help for its flags)",
		flag, c.CommandPath(), strings.Join(owners, ", "), c.CommandPath())
}

// ExactArgs is cobra.ExactArgs with a usage line in its error.
func ExactArgs(n int) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("usage: %s", c.UseLine())
		}
		return nil
	}
}

// Output adds -o/--output with the formats allowed, the first the default,
// and returns a function that checks the value given.
func Output(c *cobra.Command, formats ...string) func() (string, error) {
	o := c.Flags().StringP("output", "o", formats[0], "output format: "+strings.Join(formats, " or "))
	return func() (string, error) {
		for _, f := range formats {
			if *o == f {
				return f, nil
			}
		}
		return "", fmt.Errorf("%s: unknown output format %q (%s)", c.CommandPath(), *o, strings.Join(formats, " or "))
	}
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// NewLogger builds a command's logger on stderr: "json" (for journald) or
// "console", whose levels are coloured only when stderr is a terminal.
func NewLogger(format, level string) (*zap.Logger, error) {
	var zc zap.Config
	switch format {
	case "console":
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
		if IsTerminal(os.Stderr) {
			zc.EncoderConfig.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		zc.DisableStacktrace = true
	case "json":
		zc = zap.NewProductionConfig()
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	default:
		return nil, fmt.Errorf("log format %q: want json or console", format)
	}
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	return zc.Build()
}

// Printable is s for a terminal or a log line: every control character
// (CR and LF included: a value echoed from input must not start a line of
// its own or rewrite the one before) and every other non-printing rune
// (bidirectional overrides) written as a Go escape; invalid UTF-8 as \xNN.
func Printable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case r == '\t' || r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // '\r', '\x00', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[size:]
	}
	return b.String()
}
