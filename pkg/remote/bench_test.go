package remote

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	roostv1 "roost.dev/roost/api/gen/roost/v1"
)

// BenchmarkUnary is one List call, answered by the same gRPC server: through a unix socket
// as roostctl reaches roostd, and through the remote listener over TLS 1.3 on loopback,
// as gRPC and as Connect's JSON (HTTP/1.1, connections kept).
func BenchmarkUnary(b *testing.B) {
	f := newFixture(b)
	sock := filepath.Join(b.TempDir(), "roostd.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	go f.grpc.Serve(lis)
	b.Cleanup(f.grpc.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	grpcCall := func(c roostv1.SessionServiceClient) func(*testing.B) {
		return func(b *testing.B) {
			ctx := ctx(b)
			if _, err := c.List(ctx, &roostv1.ListRequest{}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.List(ctx, &roostv1.ListRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("socket", grpcCall(roostv1.NewSessionServiceClient(conn)))
	b.Run("remote-grpc", grpcCall(f.grpcClient(b, f.dir, "client")))
	b.Run("remote-connect-json", func(b *testing.B) {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: f.clientTLS(b, f.dir, "client")}, Timeout: 10 * time.Second}
		b.Cleanup(c.CloseIdleConnections)
		url := "https://" + f.srv.Addr().String() + "/roost.v1.SessionService/List"
		for b.Loop() {
			resp, err := c.Post(url, "application/json", strings.NewReader("{}"))
			if err != nil {
				b.Fatal(err)
			}
			var buf [512]byte
			for {
				if _, err := resp.Body.Read(buf[:]); err != nil {
					break
				}
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatal(resp.Status)
			}
		}
	})
}
