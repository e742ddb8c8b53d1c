package cgexec

// Test hooks: the commands through a given binary's helper, or the shell.
var (
	JoinCommand    = joinCommand
	StandbyCommand = standbyCommand
	Supported      = supported
)
