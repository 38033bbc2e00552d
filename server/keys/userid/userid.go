// Package userid provides the one spelling of a user id: the key under which
// Breakwater counts, limits and bans a user.
//
// Two namespaces exist. Ids the operator gives (keys create --user, users
// ban, usage ID) are trimmed of surrounding white space, put in Unicode
// normalisation form C and case-folded, so "Alice", " alice" and "ALICE"
// are one user and the two encodings of "café" are one user. Ids of users
// who sign in with a JWT are the token's sub under the prefix "jwt:", in
// NFC but not case-folded (a provider's subs are case-sensitive): a token
// can therefore never act as an API-key user, and an API-key user id can
// never start with "jwt:".
//
// Either way an id must not hold control characters, invisible characters
// (format characters such as zero-width spaces and bidi controls, variation
// selectors, fillers), white space other than a plain space, or unassigned
// and private-use code points, since those let two ids that look the same
// name two users. The package refuses; it never strips such characters
// silently.
package userid

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// MaxLen is the longest id in bytes, after normalisation and without the
// JWT prefix.
const MaxLen = 128

// JWTPrefix starts the id of every user who signs in with a JWT; the rest
// is the token's sub.
const JWTPrefix = "jwt:"

// ErrInvalid refuses an id; the wrapping error names the rule it breaks.
var ErrInvalid = errors.New("invalid user id")

// ErrReserved refuses an operator id that starts with JWTPrefix where an
// API-key user is meant.
var ErrReserved = errors.New("user id is reserved for sign-in (JWT) users")

// Normalize returns the canonical form of an id an operator typed: white
// space around it trimmed, NFC, case-folded. An id that starts with
// JWTPrefix (in any case) names a JWT user: the prefix is written in lower
// case and the rest is normalised as JWT normalises a sub. The error wraps
// ErrInvalid and names the rule the id breaks.
func Normalize(id string) (string, error) {
	if !utf8.ValidString(id) {
		return "", fmt.Errorf("%w %q: not valid UTF-8", ErrInvalid, id)
	}
	s := strings.TrimSpace(id)
	if len(s) >= len(JWTPrefix) && strings.EqualFold(s[:len(JWTPrefix)], JWTPrefix) {
		return JWT(s[len(JWTPrefix):])
	}
	s = norm.NFC.String(cases.Fold().String(norm.NFC.String(s)))
	if err := check(s); err != nil {
		return "", fmt.Errorf("%w %q: %s", ErrInvalid, id, err)
	}
	return s, nil
}

// JWT returns the id of the user a token with this sub acts for: JWTPrefix
// and the sub in NFC. The sub is not trimmed nor case-folded; one with
// white space around it is refused like any id breaking a rule.
func JWT(sub string) (string, error) {
	if !utf8.ValidString(sub) {
		return "", fmt.Errorf("%w: sub %q: not valid UTF-8", ErrInvalid, sub)
	}
	s := norm.NFC.String(sub)
	if err := check(s); err != nil {
		return "", fmt.Errorf("%w: sub %q: %s", ErrInvalid, sub, err)
	}
	return JWTPrefix + s, nil
}

// IsJWT reports whether id (canonical) names a JWT user.
func IsJWT(id string) bool { return strings.HasPrefix(id, JWTPrefix) }

// check applies the character and length rules to a normalised id and
// says which one it breaks.
func check(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > MaxLen:
		return fmt.Errorf("%d bytes, longer than %d", len(s), MaxLen)
	case strings.TrimSpace(s) != s:
		return errors.New("white space at the start or end")
	}
	for i, r := range s {
		if why := refused(r); why != "" {
			return fmt.Errorf("%s U+%04X at byte %d", why, r, i)
		}
	}
	return nil
}

// refused says why r may not be part of an id, or "" if it may.
func refused(r rune) string {
	switch {
	case r == ' ':
		return ""
	case unicode.IsControl(r):
		return "control character"
	case invisible(r):
		return "invisible character (zero-width, bidi control, variation selector or filler)"
	case unicode.IsSpace(r):
		return "white space other than a plain space"
	case !unicode.IsPrint(r):
		return "unassigned or private-use character"
	}
	return ""
}

// invisible reports whether r draws nothing: format characters (Cf: zero
// width spaces and joiners, bidi controls, the soft hyphen, tags), the
// other default-ignorable code points (fillers, the combining grapheme
// joiner), variation selectors, and the blank braille pattern.
func invisible(r rune) bool {
	return unicode.Is(unicode.Cf, r) ||
		unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
		unicode.Is(unicode.Variation_Selector, r) ||
		r == '\u2800' // BRAILLE PATTERN BLANK: a symbol, but blank
}
