package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"
)

// The values --log-level and --log-format take.
var (
	logLevels  = []string{"debug", "info", "warn", "error"}
	logFormats = []string{"text", "json"}
)

// parseLogLevel reads a --log-level value.
func parseLogLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("--log-level %q: expected one of %s", s, strings.Join(logLevels, ", "))
}

func checkLogFormat(s string) error {
	if !slices.Contains(logFormats, s) {
		return fmt.Errorf("--log-format %q: expected one of %s", s, strings.Join(logFormats, ", "))
	}
	return nil
}

// newLogger is roostd's one logger: every line it, its packages and libcontainer write
// goes through it, in one format, at or above level.
func newLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h)
	bridgeLogrus(log, level)
	return log
}

// bridgeLogrus sends what libcontainer (and the opencontainers packages it uses) logs
// through logrus to log instead: same handler, same level, same format, each line marked
// component=libcontainer. logrus itself writes nothing.
func bridgeLogrus(log *slog.Logger, level slog.Level) {
	logrus.SetOutput(io.Discard)
	logrus.SetFormatter(discardFormatter{})
	logrus.SetLevel(logrusLevel(level))
	logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	logrus.AddHook(&slogHook{log: log.With("component", "libcontainer")})
}

// logrusLevel is the logrus level that lets through what level does.
func logrusLevel(level slog.Level) logrus.Level {
	switch {
	case level <= slog.LevelDebug:
		return logrus.DebugLevel
	case level <= slog.LevelInfo:
		return logrus.InfoLevel
	case level <= slog.LevelWarn:
		return logrus.WarnLevel
	default:
		return logrus.ErrorLevel
	}
}

// slogLevel is the slog level a logrus entry is logged at: trace is debug, fatal and panic
// are errors (logrus exits or panics itself after its hooks ran).
func slogLevel(l logrus.Level) slog.Level {
	switch l {
	case logrus.TraceLevel, logrus.DebugLevel:
		return slog.LevelDebug
	case logrus.InfoLevel:
		return slog.LevelInfo
	case logrus.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// slogHook hands each logrus entry to an slog logger.
type slogHook struct{ log *slog.Logger }

func (*slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *slogHook) Fire(e *logrus.Entry) error {
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	level := slogLevel(e.Level)
	if !h.log.Enabled(ctx, level) {
		return nil
	}
	keys := make([]string, 0, len(e.Data))
	for k := range e.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	rec := slog.NewRecord(e.Time, level, e.Message, 0)
	for _, k := range keys {
		v := e.Data[k]
		if err, ok := v.(error); ok {
			v = err.Error()
		}
		rec.AddAttrs(slog.Any(k, v))
	}
	return h.log.Handler().Handle(ctx, rec)
}

// discardFormatter formats nothing: the hook has logged the entry already.
type discardFormatter struct{}

func (discardFormatter) Format(*logrus.Entry) ([]byte, error) { return nil, nil }
