package api

import (
	"bytes"
	"errors"
	"testing"

	"breakwater/server/invites"
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
		// What a request carries must go through normalisation (fuzzed
		// in package invites) without a panic.
		invites.Digest(invites.NormaliseCode(req.Code))
		invites.NormaliseEmail(req.Email)
	})
}
