// Command tiermem-example is a small Go client of tiermem: it stores memories, searches them,
// and reads the google.rpc.Status details of a refused request, with the stubs in gen/go.
//
//	go run . -target 127.0.0.1:50051 [-ca ca.pem] [-token TOKEN]
//
// Every step checks what it got and the program exits 1 on the first surprise, so it doubles as
// an interoperability test (tests/test_go_client.py runs it against a real server).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	tiermemv1 "github.com/tiermem/tiermem/gen/go/tiermem/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// bearer sends the API key with every call; over plain loopback too (the server accepts a key
// without TLS only on a loopback address).
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

func dial(ctx context.Context, target, caFile, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithBlock()}
	if caFile != "" {
		creds, err := credentials.NewClientTLSFromFile(caFile, "localhost")
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: token, secure: caFile != ""}))
	}
	return grpc.DialContext(ctx, target, opts...)
}

// details splits a refused call's google.rpc.Status into its ErrorInfo and BadRequest details.
func details(err error) (*status.Status, *errdetails.ErrorInfo, *errdetails.BadRequest) {
	st, _ := status.FromError(err)
	var info *errdetails.ErrorInfo
	var bad *errdetails.BadRequest
	for _, d := range st.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			info = v
		case *errdetails.BadRequest:
			bad = v
		}
	}
	return st, info, bad
}

func run(target, caFile, token string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := dial(ctx, target, caFile, token)
	if err != nil {
		return fmt.Errorf("cannot connect to %s: %w", target, err)
	}
	defer conn.Close()
	client := tiermemv1.NewMemoryServiceClient(conn)

	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	ns := fmt.Sprintf("go-example:%d/run:%s", os.Getpid(), hex.EncodeToString(suffix))

	// Store two memories; the server embeds their text with its built-in embedder.
	contents := []string{
		"the deploy pipeline failed on the staging cluster",
		"ana prefers tea to coffee in the morning",
	}
	ids := make([]string, len(contents))
	for i, content := range contents {
		resp, err := client.CreateMemory(ctx, &tiermemv1.CreateMemoryRequest{
			Memory: &tiermemv1.Memory{Namespace: ns, Content: content, Tags: []string{"go"}},
		})
		if err != nil {
			return fmt.Errorf("create %q: %w", content, err)
		}
		if len(resp.Memory.Id) != 32 || resp.Memory.Namespace != ns {
			return fmt.Errorf("create returned id %q in %q", resp.Memory.Id, resp.Memory.Namespace)
		}
		ids[i] = resp.Memory.Id
	}
	fmt.Printf("created %d memories in %s\n", len(ids), ns)

	// Search by text: the memory about tea comes first.
	found, err := client.SearchMemories(ctx, &tiermemv1.SearchMemoriesRequest{
		Namespaces: []string{ns}, QueryText: "what does ana drink in the morning", Limit: 5,
	})
	if err != nil {
		return fmt.Errorf("search: %w", err)
	}
	if len(found.Results) == 0 || found.Results[0].Memory.Id != ids[1] {
		return fmt.Errorf("search: expected %s first, got %v", ids[1], found.Results)
	}
	top := found.Results[0]
	fmt.Printf("search: %q (score %.3f, relevance %.3f)\n", top.Memory.Content, top.Score, top.Relevance)

	// A refused request: INVALID_ARGUMENT, with ErrorInfo and a BadRequest naming the field.
	tooHigh := float32(1.5)
	_, err = client.CreateMemory(ctx, &tiermemv1.CreateMemoryRequest{
		Memory: &tiermemv1.Memory{Namespace: ns, Content: "too important", Importance: &tooHigh},
	})
	st, info, bad := details(err)
	if st.Code() != codes.InvalidArgument || info == nil || bad == nil || len(bad.FieldViolations) == 0 {
		return fmt.Errorf("importance 1.5: expected INVALID_ARGUMENT with details, got %v", err)
	}
	if field := bad.FieldViolations[0].Field; field != "memory.importance" || info.Domain != "tiermem" {
		return fmt.Errorf("importance 1.5: details name %q in domain %q", field, info.Domain)
	}
	fmt.Printf("refused: %s %s (%s): %s\n", st.Code(), info.Reason, bad.FieldViolations[0].Field, st.Message())

	// Delete one; reading it again is NOT_FOUND with reason MEMORY_NOT_FOUND.
	if _, err := client.DeleteMemory(ctx, &tiermemv1.DeleteMemoryRequest{Namespace: ns, Id: ids[0]}); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	_, err = client.GetMemory(ctx, &tiermemv1.GetMemoryRequest{Namespace: ns, Id: ids[0]})
	if st, info, _ := details(err); st.Code() != codes.NotFound || info == nil || info.Reason != "MEMORY_NOT_FOUND" {
		return fmt.Errorf("get after delete: expected NOT_FOUND MEMORY_NOT_FOUND, got %v", err)
	}
	fmt.Println("get after delete: NOT_FOUND MEMORY_NOT_FOUND")

	if token != "" {
		// Without the key the server answers UNAUTHENTICATED before reading the request.
		anonymous, err := dial(ctx, target, caFile, "")
		if err != nil {
			return err
		}
		defer anonymous.Close()
		_, err = tiermemv1.NewMemoryServiceClient(anonymous).ListNamespaces(ctx, &tiermemv1.ListNamespacesRequest{})
		if st, info, _ := details(err); st.Code() != codes.Unauthenticated || info == nil || info.Reason != "API_KEY_MISSING" {
			return fmt.Errorf("a call without the key: expected UNAUTHENTICATED API_KEY_MISSING, got %v", err)
		}
		fmt.Println("without the key: UNAUTHENTICATED API_KEY_MISSING")
	}
	return nil
}

func main() {
	target := flag.String("target", "127.0.0.1:50051", "the server's address")
	caFile := flag.String("ca", "", "a CA certificate (PEM) to connect with TLS; the server's certificate must name localhost")
	token := flag.String("token", "", "an API key, sent as `authorization: Bearer KEY`")
	flag.Parse()
	if err := run(*target, *caFile, *token); err != nil {
		log.SetFlags(0)
		log.Fatalf("go client: FAILED: %v", err)
	}
	fmt.Println("go client: OK")
}
