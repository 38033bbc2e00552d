package jwtauth

// Reasons returns every Refusal.Reason the verifier gives, so that a
// caller can count each from zero.
func Reasons() []string {
	return []string{refusalAlgorithm, refusalUnknownKID, refusalNoKeys, refusalMissingExp, refusalSubject,
		refusalNotYetValid, refusalAuthorized, refusalKeyMismatch, refusalSignature, refusalMalformed,
		refusalTooLong, refusalNoKID, refusalExpired, refusalIssuer, refusalAudience, refusalClaims,
		refusalVerifierGone}
}
