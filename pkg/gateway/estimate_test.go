package gateway

// estimateBody is the input estimate of a body sent as it is (one whose names are unique).
func estimateBody(b []byte) int64 {
	e := estimator{}
	e.value(b, skipSpace(b, 0), 0, false)
	return e.tokens
}
