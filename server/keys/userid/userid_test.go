package userid

import (
	"errors"
	"strings"
	"testing"
)

func TestNormalizeCollides(t *testing.T) {
	const nfc, nfd = "caf\u00e9", "cafe\u0301"
	groups := [][]string{
		{"alice", "Alice", " alice", "alice ", "ALICE", "\talice\n"},
		{nfc, nfd, "CAF\u00c9", "CAFE\u0301"},
		{"jwt:user_2abc", "JWT:user_2abc", " jwt:user_2abc "},
	}
	for _, g := range groups {
		t.Run(g[0], func(t *testing.T) {
			want, err := Normalize(g[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range g[1:] {
				got, err := Normalize(id)
				if err != nil || got != want {
					t.Errorf("Normalize(%q) = %q, %v; want %q", id, got, err, want)
				}
			}
		})
	}
}

func TestNormalizeKeepsApart(t *testing.T) {
	pairs := [][2]string{
		{"alice", "alice smith"},
		{"jwt:User_2abc", "jwt:user_2abc"}, // a provider's subs are case-sensitive
		{"jwt:alice", "alice"},
	}
	for _, p := range pairs {
		a, errA := Normalize(p[0])
		b, errB := Normalize(p[1])
		if errA != nil || errB != nil || a == b {
			t.Errorf("Normalize(%q) = %q, %v and Normalize(%q) = %q, %v: want two users", p[0], a, errA, p[1], b, errB)
		}
	}
}

func TestNormalizeRefuses(t *testing.T) {
	cases := []struct {
		name, id, rule string
	}{
		{"empty", "", "empty"},
		{"only spaces", "   ", "empty"},
		{"zero-width space", "ali\u200bce", "invisible character"},
		{"zero-width joiner", "alice\u200d", "invisible character"},
		{"bidi override", "\u202ealice", "invisible character"},
		{"byte order mark", "\ufeffalice", "invisible character"},
		{"soft hyphen", "al\u00adice", "invisible character"},
		{"variation selector", "alice\ufe0f", "invisible character"},
		{"hangul filler", "alice\u3164", "invisible character"},
		{"combining grapheme joiner", "ali\u034fce", "invisible character"},
		{"braille blank", "alice\u2800", "invisible character"},
		{"no-break space inside", "alice\u00a0smith", "white space other than a plain space"},
		{"control character", "a\nb", "control character"},
		{"NUL", "bob\x00", "control character"},
		{"private use", "alice\ue000", "unassigned or private-use"},
		{"not UTF-8", "a\xffb", "not valid UTF-8"},
		{"too long", strings.Repeat("x", MaxLen+1), "longer than 128"},
		{"jwt with empty sub", "jwt:", "empty"},
		{"jwt with space around the sub", "jwt: bob", "white space at the start or end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Normalize(c.id)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Normalize(%q) = %q, %v; want ErrInvalid", c.id, got, err)
			}
			if !strings.Contains(err.Error(), c.rule) {
				t.Errorf("error %q does not name the rule %q", err, c.rule)
			}
		})
	}
	if _, err := Normalize(strings.Repeat("x", MaxLen)); err != nil {
		t.Errorf("an id of exactly %d bytes: %v", MaxLen, err)
	}
}

func TestJWT(t *testing.T) {
	cases := []struct {
		sub, want string
		ok        bool
	}{
		{"user_2abc", "jwt:user_2abc", true},
		{"auth0|5f7c", "jwt:auth0|5f7c", true},
		{"User_2ABC", "jwt:User_2ABC", true}, // not folded
		{"cafe\u0301", "jwt:caf\u00e9", true},
		{"alice\u200b", "", false},
		{" alice", "", false},
		{"", "", false},
		{strings.Repeat("u", MaxLen), "jwt:" + strings.Repeat("u", MaxLen), true},
		{strings.Repeat("u", MaxLen+1), "", false},
	}
	for _, c := range cases {
		got, err := JWT(c.sub)
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("JWT(%q) = %q, %v; want %q, ok %v", c.sub, got, err, c.want, c.ok)
		}
		if c.ok && !IsJWT(got) {
			t.Errorf("IsJWT(%q) = false", got)
		}
	}
	if IsJWT("alice") {
		t.Error(`IsJWT("alice") = true`)
	}
}
