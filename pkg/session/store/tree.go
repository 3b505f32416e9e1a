package store

// Descendants lists, from recs, the sessions below id: its children, theirs, and so on.
func Descendants(recs []*Record, id string) []*Record {
	kids := map[string][]*Record{}
	for _, r := range recs {
		if r.ParentID != "" {
			kids[r.ParentID] = append(kids[r.ParentID], r)
		}
	}
	var out []*Record
	queue := []string{id}
	for len(queue) > 0 {
		next := queue[0]
		queue = queue[1:]
		for _, c := range kids[next] {
			out = append(out, c)
			queue = append(queue, c.ID)
		}
	}
	return out
}
