// Package clierr holds the error words the pgratelimit command's packages
// share: usage errors, which the command reports with its usage line, and the
// library's errors without their package prefixes.
package clierr

import (
	"fmt"
	"strings"
)

// UsageError is a mistake in the command line, in the user's terms ("--cost
// must be at least 1, got 0"): the command prints it with its usage line and
// where to get help, and exits 2.
type UsageError struct {
	// Msg says what is wrong, naming the flag or argument.
	Msg string
	// Err is the library's error that Msg explains, if any.
	Err error
}

// Error returns Msg.
func (e UsageError) Error() string { return e.Msg }

// Unwrap returns Err.
func (e UsageError) Unwrap() error { return e.Err }

// Explained is an error of the library, Err, told in the command's words,
// Msg: errors.Is still finds Err.
type Explained struct {
	Msg string
	Err error
}

// Error returns Msg.
func (e Explained) Error() string { return e.Msg }

// Unwrap returns Err.
func (e Explained) Unwrap() error { return e.Err }

// Usagef returns a UsageError with a message formatted as by fmt.Sprintf.
func Usagef(format string, args ...any) error {
	return UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Text is err's message less the "pgratelimit: " and "pgratelimit
// migrations: " with which the library starts its messages: the command's
// name already heads the line it is printed on.
func Text(err error) string {
	s := err.Error()
	for _, p := range []string{"pgratelimit migrations: ", "pgratelimit: "} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}
