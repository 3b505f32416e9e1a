package manifest

import (
	"fmt"
	"strings"
)

// FieldError is one problem in a manifest, at a key path such as
// "capabilities.network.allow[1]". Line and Column are 1-based; 0 when unknown.
type FieldError struct {
	Path   string
	Line   int
	Column int
	Msg    string
}

func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Error is every problem found in one manifest. It classifies as an invalid argument
// (errdefs.IsInvalidArgument), so the API answers it with InvalidArgument.
type Error struct {
	File   string
	Fields []*FieldError
}

// maxReported bounds how many problems one error lists, so a garbage file does not produce
// a garbage-sized message.
const maxReported = 20

func (e *Error) Error() string {
	var b strings.Builder
	for i, f := range e.Fields {
		if i == maxReported {
			fmt.Fprintf(&b, "\n… and %d more", len(e.Fields)-maxReported)
			break
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.File)
		if f.Line > 0 {
			fmt.Fprintf(&b, ":%d", f.Line)
			if f.Column > 0 {
				fmt.Fprintf(&b, ":%d", f.Column)
			}
		}
		b.WriteString(": ")
		b.WriteString(f.Error())
	}
	return b.String()
}

// InvalidParameter marks the error as an invalid argument for errdefs.
func (*Error) InvalidParameter() {}
