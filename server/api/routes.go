package api

import "breakwater/server/edge"

// routes lists every route of the public listener (the admin listener's
// are server/admin's).
func (s *Server) routes() {
	// The body limit leaves room for multipart framing;
	// the image itself is held to max_image_bytes when it is read.
	s.public.GET("/healthz", edge.HandleHealth)
	s.public.HEAD("/healthz", edge.HandleHealth) // for monitors that only ask HEAD
	// BoundUploads (the upload rate, the transport's refusal counts)
	// paces the body that LimitBody has limited.
	// Their middleware is chained once, not by Echo on every request.
	s.public.POST("/v1/ocr", edge.Chain(s.handleOCR, edge.LimitBody(s.cfg.MaxImageBytes+multipartSlack), s.edge.BoundUploads))
	s.public.POST("/v1/invites/verify", edge.Chain(s.handleVerifyInvite, edge.LimitBodyWith(maxVerifyBody, errVerifyTooLarge)))
	// The app's guarded routes: forward auth (any method), and the paths
	// proxied to the app (routeguard.go, proxy.go, forwardauth.go).
	s.public.Any("/v1/forward-auth", s.handleForwardAuth)
	s.public.Any("/v1/forward-auth/:name", s.handleForwardAuth)
	// Every other path: each spelling of a proxied route's path is
	// matched as the route, the rest is 404.
	if s.hasProxied() {
		s.public.RouteNotFound("/*", s.handleRoute)
	}

}
