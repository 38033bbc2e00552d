//go:build race

package keys

// raceEnabled: the race detector is on, and writing many keys through
// bbolt takes about ten times as long.
const raceEnabled = true
