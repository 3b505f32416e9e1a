package gateway

// estimateBody is the input estimate of a body sent as it came.
func estimateBody(b []byte) int64 {
	fields, err := parseObject(b, "")
	if err != nil {
		panic(err)
	}
	return estimateSent(fields, nil, nil)
}
