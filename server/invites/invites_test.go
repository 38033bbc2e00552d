package invites

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzNormalise: normalising a code or an e-mail is idempotent, a code
// keeps no separator, a well-formed code holds only the alphabet and
// hashes alike in any case, and an accepted e-mail keeps the rules.
func FuzzNormalise(f *testing.F) {
	f.Add("7KQM-X3HD-9RWN", "ann@example.com")
	f.Add("7kqm x3hd 9rwn", "  Ann@Example.COM ")
	f.Add("", "")
	f.Add("\u0130\u0131", "\u212a@\u0130.tr")
	f.Fuzz(func(t *testing.T, rawCode, rawEmail string) {
		code := NormaliseCode(rawCode)
		if again := NormaliseCode(code); again != code {
			t.Fatalf("normaliseCode not idempotent: %q -> %q -> %q", rawCode, code, again)
		}
		if strings.ContainsAny(code, "- \t") {
			t.Fatalf("normalised code %q keeps a separator", code)
		}
		if WellFormed(code) {
			if len(code) != inviteCodeLen || strings.Trim(code, inviteAlphabet) != "" {
				t.Fatalf("well-formed code %q outside the alphabet", code)
			}
			if Digest(NormaliseCode(strings.ToLower(code))) != Digest(code) {
				t.Fatalf("lower-cased %q hashes differently", code)
			}
		}
		email, ok := NormaliseEmail(rawEmail)
		if !ok {
			return
		}
		if len(email) > maxEmailLen || !utf8.ValidString(email) || strings.Count(email, "@") != 1 ||
			strings.HasPrefix(email, "@") || strings.HasSuffix(email, "@") || strings.ContainsAny(email, " \t\r\n\x00") {
			t.Fatalf("accepted e-mail %q breaks the rules", email)
		}
		if again, ok := NormaliseEmail(email); !ok || again != email {
			t.Fatalf("normaliseEmail not idempotent: %q -> %q -> %q (%v)", rawEmail, email, again, ok)
		}
	})
}

func TestNewInviteCodeShape(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		code := NewCode()
		n := NormaliseCode(code)
		if !WellFormed(n) || len(code) != inviteCodeLen+inviteCodeLen/inviteGroup-1 || seen[n] {
			t.Fatalf("code %q (normalised %q) malformed or repeated", code, n)
		}
		seen[n] = true
		if NormaliseCode(strings.ToLower(strings.ReplaceAll(code, "-", " "))) != n {
			t.Fatalf("code %q does not survive lower case and spaces", code)
		}
	}
}
