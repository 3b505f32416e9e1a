package workdir

// SetBeforeReopen sets the hook the walk calls before it opens a closed level again.
func SetBeforeReopen(f func(depth int)) { beforeReopen = f }
