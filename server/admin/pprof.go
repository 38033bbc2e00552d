package admin

import (
	"net/http"
	"net/http/pprof"

	"github.com/labstack/echo/v4"

	"breakwater/server/edge"
)

// pprofProfiles are the runtime's named profiles served under
// /debug/pprof/NAME.
var pprofProfiles = []string{"allocs", "block", "goroutine", "heap", "mutex", "threadcreate"}

// maxSymbolBody bounds a POST /debug/pprof/symbol (a list of addresses).
const maxSymbolBody = 1 << 20

// pprofRoutes mounts net/http/pprof under /debug/pprof/ on g, the admin
// group (so every profile needs the admin token). The handlers are called
// directly: importing net/http/pprof also registers them on
// http.DefaultServeMux, which nothing in breakwater serves, so they are
// reachable only here, and only with server.admin_pprof on.
func pprofRoutes(g *echo.Group) {
	g.GET("/debug/pprof", func(c echo.Context) error {
		return c.Redirect(http.StatusMovedPermanently, "/debug/pprof/")
	})
	g.GET("/debug/pprof/", echo.WrapHandler(http.HandlerFunc(pprof.Index)))
	g.GET("/debug/pprof/cmdline", echo.WrapHandler(http.HandlerFunc(pprof.Cmdline)))
	g.GET("/debug/pprof/profile", echo.WrapHandler(http.HandlerFunc(pprof.Profile)))
	g.GET("/debug/pprof/symbol", echo.WrapHandler(http.HandlerFunc(pprof.Symbol)))
	g.POST("/debug/pprof/symbol", echo.WrapHandler(http.HandlerFunc(pprof.Symbol)), edge.LimitBody(maxSymbolBody))
	g.GET("/debug/pprof/trace", echo.WrapHandler(http.HandlerFunc(pprof.Trace)))
	for _, name := range pprofProfiles {
		g.GET("/debug/pprof/"+name, echo.WrapHandler(pprof.Handler(name)))
	}
}
