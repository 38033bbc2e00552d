// Package budget decides whether a user may spend: the plan quota that users
// see (successful reads per calendar month) and, in later layers, the daily
// abuse line and the global budget brake.
//
// Every decision is made in memory, atomically, before the upstream call, so
// that parallel requests can never take more than what is left. The package
// does not write to disk: the caller commits the durable record (through
// storage's group commit) and then confirms or releases the reservation it
// took here. Days and months are counted in one time zone from config.
package budget
