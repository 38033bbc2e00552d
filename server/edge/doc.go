// Package edge is the transport that both of Breakwater's listeners, the
// public API (server/api) and the admin API (server/admin), share, and
// the [server] section of config.toml that configures them: the
// connections and header blocks each listener holds (listener.go,
// headerlines.go), the client IP from trusted proxies only (clientip.go),
// a body limit enforced before anything is buffered, the bodies' memory
// service-wide and each user's requests in flight (transport.go), a
// request id we generate ourselves, panic recovery and the access log
// (middleware.go, accesslog.go), and one error handler that answers every
// failure as application/problem+json, RFC 9457 (problem.go), counting
// each refusal it answers (refusals.go, metrics.go).
//
// It knows no endpoint: the handlers, their routes and their own problems
// are the public and the admin API's, which build their Echo with
// Edge.NewEcho. Echo stays inside these three packages.
package edge
