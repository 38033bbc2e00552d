// Package api is Breakwater's public API: POST /v1/ocr, POST
// /v1/invites/verify, GET /healthz, and the app's guarded routes (forward
// auth, and the paths proxied to the app), each a handler on the
// transport of server/edge, which it shares with the admin API
// (server/admin).
//
// Handlers walk the protection layers in the order docs/DESIGN.md
// describes (through server/guard); the package holds no thresholds of
// its own and never writes to disk except through the recorders and
// stores it is given. Its Metrics join the edge's on the registry the
// admin listener serves.
package api
