package server

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzVerifyRequest feeds arbitrary bodies to the invite request decoding
// and the code and e-mail normalisation. Decoding either succeeds or gives
// one of its two problems; normalisation is idempotent, a well-formed code
// is exactly 12 alphabet characters, and a generated code survives any
// casing and separators. Its seed corpus is in testdata/fuzz.
func FuzzVerifyRequest(f *testing.F) {
	f.Add([]byte(`{"code":"7KQM-X3HD-9RWN","email":"ann@example.com"}`))
	f.Add([]byte(`{"code":"7kqm x3hd 9rwn","email":"  Ann@Example.COM "}`))
	f.Add([]byte(`{"code":"","email":""}`))
	f.Add([]byte(`{"code":"\u0130\u0131","email":"\u212a@\u0130.tr"}`))
	f.Add([]byte(`{"code":1}`))
	f.Add([]byte(`{"code":"a"} trailing`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeVerifyRequest(bytes.NewReader(body))
		if err != nil {
			if !errors.Is(err, errVerifyBody) && !errors.Is(err, errVerifyTooLarge) {
				t.Fatalf("decode error %v is not one of its problems", err)
			}
			return
		}
		code := normaliseCode(req.Code)
		if again := normaliseCode(code); again != code {
			t.Fatalf("normaliseCode not idempotent: %q -> %q -> %q", req.Code, code, again)
		}
		if strings.ContainsAny(code, "- \t") {
			t.Fatalf("normalised code %q keeps a separator", code)
		}
		if wellFormedCode(code) {
			if len(code) != inviteCodeLen || strings.Trim(code, inviteAlphabet) != "" {
				t.Fatalf("well-formed code %q outside the alphabet", code)
			}
			if hashInviteCode(normaliseCode(strings.ToLower(code))) != hashInviteCode(code) {
				t.Fatalf("lower-cased %q hashes differently", code)
			}
		}
		email, ok := normaliseEmail(req.Email)
		if !ok {
			return
		}
		if len(email) > maxEmailLen || !utf8.ValidString(email) || strings.Count(email, "@") != 1 ||
			strings.HasPrefix(email, "@") || strings.HasSuffix(email, "@") || strings.ContainsAny(email, " \t\r\n\x00") {
			t.Fatalf("accepted e-mail %q breaks the rules", email)
		}
		if again, ok := normaliseEmail(email); !ok || again != email {
			t.Fatalf("normaliseEmail not idempotent: %q -> %q -> %q (%v)", req.Email, email, again, ok)
		}
	})
}

func TestNewInviteCodeShape(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		code := newInviteCode()
		n := normaliseCode(code)
		if !wellFormedCode(n) || len(code) != inviteCodeLen+inviteCodeLen/inviteGroup-1 || seen[n] {
			t.Fatalf("code %q (normalised %q) malformed or repeated", code, n)
		}
		seen[n] = true
		if normaliseCode(strings.ToLower(strings.ReplaceAll(code, "-", " "))) != n {
			t.Fatalf("code %q does not survive lower case and spaces", code)
		}
	}
}
