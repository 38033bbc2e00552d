//go:build race

package keys_test

// raceEnabled: the race detector is on, and writing many keys through
// bbolt takes about ten times as long.
const raceEnabled = true
