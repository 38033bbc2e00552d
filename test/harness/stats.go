package harness

import (
	"math"
	"slices"
)

// Median is the median of v, which it leaves alone.
func Median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MedianInterval is the median of v and its distribution-free 95%
// interval: the order statistics n/2 ± 1.96·√n/2 (the sign test's), as
// the timing tests compare two classes of request by the median of their
// rounds' differences.
func MedianInterval(v []float64) (m, lo, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	half := int(math.Ceil(1.96 * math.Sqrt(float64(n)) / 2))
	return Median(s), s[max(0, n/2-half)], s[min(n-1, (n-1)/2+half)]
}
