// Command apirun runs sessions of a capsule through roostd's API from one connection, as a
// program that stays up does (an SDK, a parent capsule's agent): bench/sealed.sh times a
// start without a client process's own start. Each line on stdin starts one session (Stage,
// Launch, Wait); "<microseconds> <session id> <stage us> <launch us> <wait us>", or the
// error, goes to stdout.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

func main() {
	socket := flag.String("socket", "", "roostd's socket")
	capsule := flag.String("capsule", "", "capsule directory")
	flag.Parse()
	if *socket == "" || *capsule == "" {
		fmt.Fprintln(os.Stderr, "usage: apirun --socket PATH --capsule DIR  (a line on stdin per session)")
		os.Exit(2)
	}
	conn, err := grpc.NewClient("unix://"+*socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "apirun:", err)
		os.Exit(1)
	}
	defer conn.Close()
	c := roostv1.NewSessionServiceClient(conn)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		began := time.Now()
		id, took, err := runOne(c, *capsule)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Println(time.Since(began).Microseconds(), id, took[0].Microseconds(), took[1].Microseconds(), took[2].Microseconds())
	}
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
