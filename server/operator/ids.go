package operator

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// ErrBadID refuses an id the operator names (a key's, an invite's, a
// cooldown's key or source) that is not text: empty, not valid UTF-8, or
// holding a control character. No id the service makes is any of these,
// and PostgreSQL refuses a NUL or a byte that is no UTF-8 as a fault, so
// such an id is bad input, refused before it reaches storage. A user id
// has its own rules (package userid), which refuse the same.
var ErrBadID = errors.New("operator: not an id")

// BadIDError is ErrBadID with the id, its kind and the rule it breaks.
type BadIDError struct {
	Kind string // "key id", "invite id", "cooldown key", "cooldown source"
	ID   string
	Why  string // "empty", "not valid UTF-8", "control character U+0000 at byte 3"
}

func (e *BadIDError) Error() string        { return fmt.Sprintf("invalid %s %q: %s", e.Kind, e.ID, e.Why) }
func (e *BadIDError) Is(target error) bool { return target == ErrBadID }

// CheckID refuses, with a *BadIDError, an id of kind that is not text;
// see ErrBadID. It is the one check of every id an operator's command
// takes, whichever way the command comes: Operator runs it before storage
// or memory is asked, and the command line before it reaches a service.
func CheckID(kind, id string) error {
	why := ""
	switch {
	case id == "":
		why = "empty"
	case !utf8.ValidString(id):
		why = "not valid UTF-8"
	default:
		for i, r := range id {
			if unicode.IsControl(r) {
				why = fmt.Sprintf("control character U+%04X at byte %d", r, i)
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return &BadIDError{Kind: kind, ID: id, Why: why}
}

// The kinds of id CheckID names.
const (
	KindKey            = "key id"
	KindInvite         = "invite id"
	KindCooldownKey    = "cooldown key"
	KindCooldownSource = "cooldown source"
)
