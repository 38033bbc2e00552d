package limiter

import "testing"

func TestClientKey(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.9":             "203.0.113.9",
		"::ffff:203.0.113.9":      "203.0.113.9",
		"2001:db8:1:2:3:4:5:6":    "2001:db8:1:2::/64",
		"2001:db8:1:2::1%eth0":    "2001:db8:1:2::/64",
		"not an address":          "not an address",
		"2001:db8:1:2:ffff::ffff": "2001:db8:1:2::/64",
	} {
		if got := ClientKey(in); got != want {
			t.Errorf("ClientKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestClientKeyIPv4NoCopy: an IPv4 address is its own key, returned
// without being formatted again (this runs on every refusal).
func TestClientKeyIPv4NoCopy(t *testing.T) {
	if allocs := testing.AllocsPerRun(100, func() { ClientKey("203.0.113.9") }); allocs != 0 {
		t.Errorf("ClientKey of an IPv4 address: %v allocations, want 0", allocs)
	}
}
