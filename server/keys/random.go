package keys

import "crypto/rand"

// Base62 is the alphabet of API key secrets and of key and invite ids.
const Base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// RandomString returns n characters drawn uniformly from alphabet (at most
// 256 distinct bytes) with crypto/rand: rejection sampling drops the bytes
// past the last whole multiple of len(alphabet), so no character is more
// likely than another.
func RandomString(n int, alphabet string) string {
	limit := 256 - 256%len(alphabet)
	out := make([]byte, 0, n)
	buf := make([]byte, 2*n)
	for len(out) < n {
		_, _ = rand.Read(buf) // crypto/rand.Read never fails on supported platforms
		for _, b := range buf {
			if int(b) >= limit {
				continue
			}
			out = append(out, alphabet[int(b)%len(alphabet)])
			if len(out) == n {
				break
			}
		}
	}
	return string(out)
}
