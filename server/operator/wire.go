package operator

// The bodies of the admin API, which AdminClient sends and the transport's
// handlers read.

// CreateKeyRequest is the body of POST /api/keys.
type CreateKeyRequest struct {
	User string `json:"user"`
	Plan string `json:"plan"`
}

// CreateKeyResponse is the answer: the key's description and, this once,
// its secret.
type CreateKeyResponse struct {
	KeyInfo
	Key string `json:"key"`
}

// UserRequest is the body of POST /api/users/:id (every field optional).
type UserRequest struct {
	Banned *bool  `json:"banned"`
	Plan   string `json:"plan"`
	// Create lets a ban make the record of an id not seen yet (a sign-in
	// user, jwt:SUB); without it an unknown id is 404.
	Create bool `json:"create,omitempty"`
}

// BrakeRequest is the body of POST /api/brake.
type BrakeRequest struct {
	On *bool `json:"on"`
}

// CreateInviteRequest is the body of POST /api/invites.
type CreateInviteRequest struct {
	Uses int `json:"uses"`
	// Expires is a Go duration such as "72h"; "" or "0" means never.
	Expires string `json:"expires"`
	Note    string `json:"note"`
}

// CreateInviteResponse is the answer: the invite and, this once, its code.
type CreateInviteResponse struct {
	InviteInfo
	Code string `json:"code"`
}

// DetectRunRequest is the body of POST /api/detect/run.
type DetectRunRequest struct {
	Day    string `json:"day"`     // "" means yesterday
	NoMail bool   `json:"no_mail"` // skip the digest
}

// ClearCooldownRequest is the body of POST /api/cooldowns/clear.
// Source is "invites" (also when empty) or "route:NAME".
type ClearCooldownRequest struct {
	Source string `json:"source,omitempty"`
	Key    string `json:"key"`
}

// problem is what AdminClient reads of a problem+json answer.
type problem struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
	Detail string `json:"detail"`
}
