package operator_test

import (
	"errors"
	"strings"
	"testing"

	"breakwater/server/operator"
)

func TestCheckID(t *testing.T) {
	cases := []struct {
		name, id, why string // why "": accepted
	}{
		{"a key id", "key_a1B2c3D4e5", ""},
		{"an invite id", "inv_a1B2c3D4e5", ""},
		{"a cooldown key", "email:ann@example.com", ""},
		{"text beyond ASCII", "café ☕", ""},
		{"a percent sign", "%00", ""},
		{"empty", "", "empty"},
		{"NUL", "\x00", "control character U+0000 at byte 0"},
		{"a NUL inside", "key_ab\x00cd", "control character U+0000 at byte 6"},
		{"a tab", "a\tb", "control character U+0009 at byte 1"},
		{"DEL", "a\x7f", "control character U+007F at byte 1"},
		{"a C1 control", "a\u0085", "control character U+0085 at byte 1"},
		{"a byte that is no UTF-8", "\xff", "not valid UTF-8"},
		{"an overlong slash", "\xc0\xaf", "not valid UTF-8"},
		{"a lone surrogate", "\xed\xa0\x80", "not valid UTF-8"},
		{"a cut sequence", "caf\xc3", "not valid UTF-8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := operator.CheckID(operator.KindKey, c.id)
			if c.why == "" {
				if err != nil {
					t.Errorf("CheckID(%q) = %v, want nil", c.id, err)
				}
				return
			}
			if !errors.Is(err, operator.ErrBadID) || !strings.HasPrefix(err.Error(), "invalid key id ") || !strings.HasSuffix(err.Error(), ": "+c.why) {
				t.Errorf("CheckID(%q) = %v, want ErrBadID saying %q", c.id, err, c.why)
			}
		})
	}
}
