package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// logTimeLayout is RFC 3339 with nanoseconds always nine digits (time.RFC3339Nano drops
// trailing zeros): prefixes line up, and sort as text as they do as times.
const logTimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

func (a *app) logsCommand() *cobra.Command {
	var o logsOptions
	var tail, since string
	cmd := &cobra.Command{
		Use:   "logs SESSION",
		Short: "Print a session's output",
		Long: `logs prints what the session's program wrote: stdout to stdout, stderr to stderr.
With -f it keeps printing until the session ends; if it loses roostd meanwhile (a restart,
a crash) it says so on stderr, waits for roostd and resumes where it stopped, so every byte
is printed exactly once.
--tail N prints only each stream's last N lines (then, with -f, what follows); --since only
what was written at or after a time, or within a duration before now; -t starts each line
with the time its first byte was written (RFC 3339, nanoseconds). roost-init records those
times as it takes the output from the program, to the millisecond; sessions from before it
did have no times: their lines get no prefix, and --since judges them by their files.
Each stream is kept within the capsule's resources.log_max_bytes: its first bytes and its
newest. Where bytes were dropped between them a line says how many:
  --- roost: 123456 bytes of stdout dropped here (resources.log_max_bytes 67108864) ---
inspect shows, per stream, the bytes written and dropped.
On a terminal, control characters in the output other than newline, tab and carriage
return (escape sequences that would set the clipboard or the window title, clear or move
about the screen) are shown as text, \x1b for ESC; --raw passes them to the terminal as
they are. Piped or redirected to a file, the output is always the session's bytes as they
are.
--json prints, to stdout, one JSON object a line for each line of either stream:
{"stream":"stdout","time":"...","line":"..."}, line without its newline (bytes that are
not UTF-8 become U+FFFD), time when its first byte was written (absent for sessions from
before roost-init recorded times).`,
		Example: `  roostctl logs ses_01a2                      # everything kept
  roostctl logs -f --tail 20 ses_01a2         # the last 20 lines of each stream, then follow
  roostctl logs --since 10m -t ses_01a2       # the last ten minutes, each line timed
  roostctl logs --since 2025-05-01T12:00:00Z ses_01a2
  roostctl logs --raw ses_01a2                # colours and all, on a terminal
  roostctl logs --json ses_01a2 | jq -r 'select(.stream == "stderr") | .line'`,
		Args: exactArgs(1, "one SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("tail") && tail != "all" {
				n, err := strconv.ParseInt(tail, 10, 64)
				if err != nil || n < 0 {
					return usageError{fmt.Errorf("--tail %q: give a number of lines, 0 or more, or all", tail)}
				}
				o.tail = &n
			}
			if since != "" {
				t, err := parseTimeFlag("--since", since, time.Now(), false)
				if err != nil {
					return err
				}
				o.since = t
			}
			return a.streamLogs(cmd.Context(), args[0], o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	cmd.Flags().BoolVarP(&o.follow, "follow", "f", false, "keep printing output until the session ends")
	cmd.Flags().StringVar(&tail, "tail", "all", "print only each stream's last `N` lines")
	cmd.Flags().StringVar(&since, "since", "", "print only output written at or after `T`: RFC 3339, Unix seconds, or a duration before now")
	cmd.Flags().BoolVarP(&o.timestamps, "timestamps", "t", false, "start each line with when it was written")
	cmd.Flags().BoolVar(&o.json, "json", false, "print one JSON object per line of output, with its stream and time")
	cmd.Flags().BoolVar(&o.raw, "raw", false, "on a terminal, pass control characters and escape sequences through rather than show them as text")
	return cmd
}

// logsOptions is what logs (and run) ask of a session's output.
type logsOptions struct {
	follow, timestamps bool
	// raw passes the output to a terminal as it is, escape sequences and all.
	raw   bool
	tail  *int64
	since time.Time
	// json prints each line as an object of its own, on stdout.
	json bool
	// launched: this roostd has just launched the session for the caller, so it was
	// there and knows the session; no Get need say so first.
	launched bool
}

// copyLogs streams all of the output of a session roostd has just launched to stdout and
// stderr (with follow, until it ends, across roostd restarts).
func (a *app) copyLogs(ctx context.Context, id string, follow, raw bool, stdout, stderr io.Writer) error {
	return a.streamLogs(ctx, id, logsOptions{follow: follow, raw: raw, launched: true}, stdout, stderr)
}

// streamLogs prints a session's output as o asks. Following, a lost roostd is waited for
// and the stream resumed at the offsets reached: roost-init's files are still there, so
// nothing is lost or printed twice (unless the cap dropped it meanwhile: then the marker
// says so).
func (a *app) streamLogs(ctx context.Context, id string, o logsOptions, stdout, stderr io.Writer) error {
	c, err := a.sessions()
	if err != nil {
		return err
	}
	req := &roostv1.LogsRequest{Id: id, Follow: o.follow, Timestamps: o.timestamps || o.json, Tail: o.tail}
	if !o.since.IsZero() {
		req.Since = timestamppb.New(o.since)
	}
	if o.follow && !o.launched {
		// Only a roostd that was there is waited for: one that cannot be reached at all,
		// or a session it does not know, is said at once.
		if _, err := c.Get(ctx, &roostv1.GetRequest{Id: id}); err != nil {
			return err
		}
	}
	out, flushOut := sessionOutput(stdout, o.raw)
	errOut, flushErr := sessionOutput(stderr, o.raw)
	defer func() {
		// A character the stream ended inside of is shown, escaped, once no more can come.
		_ = flushOut()
		_ = flushErr()
	}()
	p := &logPrinter{out: [2]io.Writer{out, errOut}, timestamps: o.timestamps}
	if o.json {
		p.jsonOut = stdout
	}
	var opts []grpc.CallOption
	for {
		err := p.copy(ctx, c, req, opts...)
		if err == nil || !o.follow || status.Code(err) != codes.Unavailable {
			if ferr := p.flushJSON(); err == nil && !errors.Is(ferr, syscall.EPIPE) {
				err = ferr
			}
			return err
		}
		fmt.Fprintf(stderr, "roostctl: lost roostd (%s); resuming once it is back\n", status.Convert(err).Message())
		if p.received {
			// roostd sends where each stream begins before any output: from here on the
			// offsets say it all, and a tail counted again would count newer lines.
			req.Tail = nil
			req.StdoutOffset, req.StderrOffset = p.next[0], p.next[1]
		}
		opts = []grpc.CallOption{grpc.WaitForReady(true)}
	}
}

// logPrinter writes a session's output as it arrives, remembering where each stream is.
type logPrinter struct {
	out        [2]io.Writer
	timestamps bool
	// next is, per stream, the offset past the last byte received; received says anything
	// (output, or where a stream begins) was.
	next     [2]int64
	received bool
	// midLine says a stream's last byte printed did not end a line: what follows gets no
	// time of its own.
	midLine [2]bool
	buf     []byte
	// jsonOut, when set, takes every line as a JSON object; partial holds, per stream, the
	// start of a line not ended yet, and partialTime when its first byte was written.
	jsonOut     io.Writer
	partial     [2][]byte
	partialTime [2]*timestamppb.Timestamp
}

// logLine is one line of logs --json.
type logLine struct {
	Stream string `json:"stream"`
	Time   string `json:"time,omitempty"`
	Line   string `json:"line"`
}

var streamNames = [2]string{"stdout", "stderr"}

// printJSON writes each line data ends as an object; the rest waits for the next chunk of
// its stream, or the end.
func (p *logPrinter) printJSON(i int, data []byte, at *timestamppb.Timestamp) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for len(data) > 0 {
		if len(p.partial[i]) == 0 {
			p.partialTime[i] = at
		}
		line, after, found := bytes.Cut(data, []byte{'\n'})
		p.partial[i] = append(p.partial[i], line...)
		data = after
		if !found {
			break
		}
		if err := enc.Encode(p.lineObject(i)); err != nil {
			return err
		}
	}
	_, err := p.jsonOut.Write(buf.Bytes())
	return err
}

func (p *logPrinter) lineObject(i int) logLine {
	l := logLine{Stream: streamNames[i], Line: strings.ToValidUTF8(string(p.partial[i]), "\uFFFD")}
	if t := p.partialTime[i]; t != nil {
		l.Time = t.AsTime().Format(time.RFC3339Nano)
	}
	p.partial[i], p.partialTime[i] = p.partial[i][:0], nil
	return l
}

// flushJSON writes the lines a stream ended without a newline.
func (p *logPrinter) flushJSON() error {
	if p.jsonOut == nil {
		return nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for i := range p.partial {
		if len(p.partial[i]) > 0 {
			if err := enc.Encode(p.lineObject(i)); err != nil {
				return err
			}
		}
	}
	_, err := p.jsonOut.Write(buf.Bytes())
	return err
}

func (p *logPrinter) copy(ctx context.Context, c roostv1.SessionServiceClient, req *roostv1.LogsRequest, opts ...grpc.CallOption) error {
	stream, err := c.Logs(ctx, req, opts...)
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := p.print(resp); err != nil {
			if errors.Is(err, syscall.EPIPE) {
				return nil
			}
			return err
		}
	}
}

func (p *logPrinter) print(resp *roostv1.LogsResponse) error {
	i := 0
	if resp.GetStream() == "stderr" {
		i = 1
	}
	p.received = true
	data := resp.GetData()
	if resp.GetOffset() >= 0 {
		p.next[i] = resp.GetOffset() + int64(len(data))
	}
	if len(data) == 0 {
		return nil
	}
	if p.jsonOut != nil {
		return p.printJSON(i, data, resp.GetTime())
	}
	out := data
	if p.timestamps && resp.GetTime() != nil {
		prefix := resp.GetTime().AsTime().Local().Format(logTimeLayout) + " "
		p.buf = p.buf[:0]
		for rest, mid := data, p.midLine[i]; len(rest) > 0; mid = false {
			if !mid {
				p.buf = append(p.buf, prefix...)
			}
			line, after, found := bytes.Cut(rest, []byte{'\n'})
			p.buf = append(p.buf, line...)
			if found {
				p.buf = append(p.buf, '\n')
			}
			rest = after
		}
		out = p.buf
	}
	p.midLine[i] = data[len(data)-1] != '\n'
	_, err := p.out[i].Write(out)
	return err
}
