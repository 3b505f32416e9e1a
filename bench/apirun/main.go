// Command apirun runs sessions of a capsule through roostd's API from one connection, as a
// program that stays up does (an SDK, a parent capsule's agent): bench/sealed.sh and
// bench/sdk.sh time a start without a client process's own start. Each line on stdin starts
// one session (Stage, Launch, Wait); "<microseconds> <session id> <stage us> <launch us>
// <wait us>", or the error, goes to stdout. With --exec PROGRAM each session is instead
// staged, launched, runs PROGRAM by Exec and is removed (force): the SDKs' create, exec and
// remove, "<microseconds> <session id> <stage+launch us> <exec us> <remove us>". A line
// "files BYTES" instead writes then reads back BYTES bytes (WriteFile in 256 KiB messages, as
// the SDKs send them, and ReadFile) in one session of the capsule, made at the first such
// line and removed at the end of stdin: "<write us> <read us>". --server with --ca, --cert
// and --key reaches roostd's mTLS listener instead of its socket.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func main() {
	socket := flag.String("socket", "", "roostd's socket")
	server := flag.String("server", "", "roostd's remote listener, host:port (instead of --socket)")
	ca := flag.String("ca", "", "with --server: the CA that signed roostd's certificate")
	cert := flag.String("cert", "", "with --server: this client's certificate")
	key := flag.String("key", "", "with --server: this client's key")
	capsule := flag.String("capsule", "", "capsule directory, or a pushed name@version")
	execProg := flag.String("exec", "", "exec this program in each session, then remove it, instead of waiting for its end")
	flag.Parse()
	if (*socket == "") == (*server == "") || *capsule == "" {
		fmt.Fprintln(os.Stderr, "usage: apirun (--socket PATH | --server HOST:PORT --ca F --cert F --key F) --capsule DIR [--exec PROGRAM]  (a line on stdin per session)")
		os.Exit(2)
	}
	conn, err := dial(*socket, *server, *ca, *cert, *key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apirun:", err)
		os.Exit(1)
	}
	defer conn.Close()
	c := roostv1.NewSessionServiceClient(conn)
	f := &filesBench{c: c, files: roostv1.NewFilesServiceClient(conn), capsule: *capsule}
	defer f.close()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if n, ok := strings.CutPrefix(in.Text(), "files "); ok {
			size, err := strconv.Atoi(n)
			if err != nil || size < 0 {
				fmt.Printf("error: %q: not files BYTES\n", in.Text())
				continue
			}
			w, r, err := f.writeRead(size)
			if err != nil {
				fmt.Println("error:", err)
				continue
			}
			fmt.Println(w.Microseconds(), r.Microseconds())
			continue
		}
		began := time.Now()
		var id string
		var took [3]time.Duration
		if *execProg != "" {
			id, took, err = roundTrip(c, *capsule, *execProg)
		} else {
			id, took, err = runOne(c, *capsule)
		}
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(time.Since(began).Microseconds(), id, took[0].Microseconds(), took[1].Microseconds(), took[2].Microseconds())
	}
}

// filesBench times WriteFile and ReadFile in one session it made.
type filesBench struct {
	c       roostv1.SessionServiceClient
	files   roostv1.FilesServiceClient
	capsule string
	session string
	blob    []byte
}

func (f *filesBench) writeRead(size int) (write, read time.Duration, err error) {
	ctx := context.Background()
	if f.session == "" {
		s, err := f.c.Stage(ctx, &roostv1.StageRequest{Capsule: f.capsule})
		if err != nil {
			return 0, 0, err
		}
		f.session = s.GetSession().GetId()
		if _, err := f.c.Launch(ctx, &roostv1.LaunchRequest{Id: f.session}); err != nil {
			return 0, 0, err
		}
	}
	if len(f.blob) != size {
		f.blob = make([]byte, size)
		for i := range f.blob {
			f.blob[i] = byte(i % 251)
		}
	}
	began := time.Now()
	w, err := f.files.WriteFile(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Header{Header: &roostv1.WriteFileHeader{Session: f.session, Path: "blob"}}}); err != nil {
		return 0, 0, err
	}
	for off := 0; off < size; off += 256 << 10 {
		if err := w.Send(&roostv1.WriteFileRequest{Part: &roostv1.WriteFileRequest_Data{Data: f.blob[off:min(size, off+256<<10)]}}); err != nil {
			return 0, 0, err
		}
	}
	if _, err := w.CloseAndRecv(); err != nil {
		return 0, 0, err
	}
	write = time.Since(began)
	began = time.Now()
	r, err := f.files.ReadFile(ctx, &roostv1.ReadFileRequest{Session: f.session, Path: "blob"})
	if err != nil {
		return write, 0, err
	}
	back := make([]byte, 0, size)
	for {
		resp, err := r.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return write, 0, err
		}
		back = append(back, resp.GetData()...)
	}
	read = time.Since(began)
	if string(back) != string(f.blob) {
		return write, read, fmt.Errorf("read back %d bytes of the %d written, or other bytes", len(back), size)
	}
	return write, read, nil
}

func (f *filesBench) close() {
	if f.session != "" {
		f.c.Remove(context.Background(), &roostv1.RemoveRequest{Id: f.session, Force: true})
	}
}

func dial(socket, server, ca, cert, key string) (*grpc.ClientConn, error) {
	if socket != "" {
		return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca %s: holds no PEM certificate", ca)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("--cert %s with --key %s: %w", cert, key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, Certificates: []tls.Certificate{pair}}
	return grpc.NewClient("dns:///"+server, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// runOne is `roostctl run` of a program with no output: Stage, Launch, Wait, exit code 0.
// It returns how long each of the three calls took.
func runOne(c roostv1.SessionServiceClient, capsule string) (id string, took [3]time.Duration, err error) {
	ctx := context.Background()
	began := time.Now()
	s, err := c.Stage(ctx, &roostv1.StageRequest{Capsule: capsule})
	if err != nil {
		return "", took, err
	}
	id = s.GetSession().GetId()
	took[0] = time.Since(began)
	began = time.Now()
	if _, err := c.Launch(ctx, &roostv1.LaunchRequest{Id: id}); err != nil {
		return id, took, err
	}
	took[1] = time.Since(began)
	began = time.Now()
	w, err := c.Wait(ctx, &roostv1.WaitRequest{Id: id})
	if err != nil {
		return id, took, err
	}
	took[2] = time.Since(began)
	if st := w.GetSession(); st.GetExitCode() != 0 {
		return id, took, fmt.Errorf("session %s ended %s, code %d", id, st.GetState(), st.GetExitCode())
	}
	return id, took, nil
}

// roundTrip is what the SDKs' sessions.create, exec([prog]) and remove({force}) call: Stage
// and Launch, Exec, Remove. It returns how long each of the three steps took.
func roundTrip(c roostv1.SessionServiceClient, capsule, prog string) (id string, took [3]time.Duration, err error) {
	ctx := context.Background()
	began := time.Now()
	s, err := c.Stage(ctx, &roostv1.StageRequest{Capsule: capsule})
	if err != nil {
		return "", took, err
	}
	id = s.GetSession().GetId()
	if _, err := c.Launch(ctx, &roostv1.LaunchRequest{Id: id}); err != nil {
		return id, took, err
	}
	took[0] = time.Since(began)
	began = time.Now()
	if err := execOne(ctx, c, id, prog); err != nil {
		return id, took, err
	}
	took[1] = time.Since(began)
	began = time.Now()
	if _, err := c.Remove(ctx, &roostv1.RemoveRequest{Id: id, Force: true}); err != nil {
		return id, took, err
	}
	took[2] = time.Since(began)
	return id, took, nil
}

// execOne runs prog in session id with an empty stdin and wants its exit code 0.
func execOne(ctx context.Context, c roostv1.SessionServiceClient, id, prog string) error {
	st, err := c.Exec(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&roostv1.ExecRequest{Msg: &roostv1.ExecRequest_Start{Start: &roostv1.ExecStart{Id: id, Command: []string{prog}}}}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("exec %s in %s: the stream ended without its exit", prog, id)
		}
		if err != nil {
			return err
		}
		if e := r.GetExit(); e != nil {
			if e.GetExitCode() != 0 {
				return fmt.Errorf("exec %s in %s: %s", prog, id, e.GetDetail())
			}
			return nil
		}
	}
}
