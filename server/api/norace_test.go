//go:build !race

package api

// raceEnabled: the race detector is on, and allocation counts run a
// little higher.
const raceEnabled = false
