package roostinit

import (
	"os"
	"time"

	"golang.org/x/sys/unix"

	"roost.dev/roost/pkg/records"
)

// Output keeps a command's stdout and stderr, read from pipes roostd holds, in a directory
// laid out as a session's records keep the program's (see records.LogsFile): the same
// pump and sinks, so the same readers serve it. roostd keeps a detached exec's output so.
type Output struct {
	p *logPump
}

// KeepOutput creates the streams' files and logs.json in dir (which must exist), each
// stream held to maxBytes, with capName naming that bound in logs.json (records.LogStats.Cap),
// and starts copying stdout and stderr into them. stderr may be nil (a command on a
// terminal writes to stdout alone). The pipes are the Output's from then on.
func KeepOutput(dir string, maxBytes int64, capName string, stdout, stderr *os.File) (*Output, error) {
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	p := &logPump{
		dir:     dirfd,
		child:   [2]int{-1, -1},
		pipes:   [2]*os.File{stdout, stderr},
		cut:     make(chan struct{}, 1),
		stop:    make(chan struct{}),
		flusher: make(chan struct{}),
	}
	p.stats = records.LogStats{MaxBytes: maxBytes, Cap: capName, UpdatedAt: time.Now().UTC()}
	layout := records.LayoutFor(maxBytes)
	for i, name := range []string{records.StdoutStream, records.StderrStream} {
		s := &logSink{dir: dirfd, stream: name, layout: layout, stats: p.stats.Stream(name), pump: p}
		if err := s.openHead(); err != nil {
			p.closeSinks()
			unix.Close(dirfd)
			return nil, err
		}
		p.sinks[i] = s
	}
	if err := writeJSONAtomically(dirfd, records.LogsFile, p.stats); err != nil {
		p.closeSinks()
		unix.Close(dirfd)
		return nil, err
	}
	for i, pipe := range p.pipes {
		if pipe == nil {
			p.sinks[i].closeFile()
			continue
		}
		p.wg.Add(1)
		go p.run(pipe, p.sinks[i])
	}
	go p.flush()
	return &Output{p: p}, nil
}

// Finish drains the pipes for at most grace (the command has ended; whatever it left that
// still holds them is not waited for), closes them and writes the final counts.
func (o *Output) Finish(grace time.Duration) records.LogStats {
	st := o.p.finish(grace)
	unix.Close(o.p.dir)
	return st
}
