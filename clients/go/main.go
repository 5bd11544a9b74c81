// Command runifold-go calls the Runifold services from Go with the code generated in
// gen/go: it creates a conversation, appends to it, reads the google.rpc.ErrorInfo of a
// version conflict from the status details, curates a memory from the transcript and
// searches for it, printing what it got.
//
//	runifold-go -target 127.0.0.1:50051 -namespace tenant-42
//
// Build it with `make go` (clients/go/build.sh): GOPATH mode over Debian's Go packages,
// no module proxy.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	commonv1 "github.com/runifold/runifold/gen/go/runifold/common/v1"
	memoryv1 "github.com/runifold/runifold/gen/go/runifold/memory/v1"
	transcriptv1 "github.com/runifold/runifold/gen/go/runifold/transcript/v1"
)

func main() {
	target := flag.String("target", "127.0.0.1:50051", "the server's gRPC address")
	namespace := flag.String("namespace", "go-example", "the tenant's namespace")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for the server, and for the memory to be searchable")
	flag.Parse()
	if err := run(*target, *namespace, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "runifold-go:", err)
		os.Exit(1)
	}
}

func run(target, namespace string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// Plaintext, as the all-in-one server listens by default; use
	// grpc.WithTransportCredentials(credentials.NewTLS(...)) against a TLS listener.
	conn, err := grpc.DialContext(ctx, target, grpc.WithInsecure(), grpc.WithBlock())
	if err != nil {
		return fmt.Errorf("dial %s: %w", target, err)
	}
	defer conn.Close()
	transcript := transcriptv1.NewTranscriptServiceClient(conn)
	memory := memoryv1.NewMemoryServiceClient(conn)

	created, err := transcript.CreateConversation(ctx, &transcriptv1.CreateConversationRequest{
		Namespace: namespace,
		Labels:    map[string]string{"client": "go"},
	})
	if err != nil {
		return fmt.Errorf("CreateConversation: %w", err)
	}
	conversation := created.GetConversation()
	id := conversation.GetConversationId()
	fmt.Printf("created conversation %s version %d\n", id, conversation.GetVersion())

	// An append that quotes the version it read (0) and a request_id, so that a retry
	// after a lost reply returns the first result instead of writing twice.
	appended, err := transcript.AppendEntries(ctx, &transcriptv1.AppendEntriesRequest{
		Namespace:       namespace,
		ConversationId:  id,
		ExpectedVersion: proto.Int64(conversation.GetVersion()),
		RequestId:       requestID(),
		Messages: []*commonv1.Message{
			{Role: commonv1.Role_ROLE_USER, Text: "We ship on Friday."},
			{Role: commonv1.Role_ROLE_ASSISTANT, Text: "Noted: the release is on Friday."},
		},
	})
	if err != nil {
		return fmt.Errorf("AppendEntries: %w", err)
	}
	fmt.Printf("appended sequences %d..%d version %d\n",
		appended.GetFirstSequence(), appended.GetLastSequence(), appended.GetVersion())

	// The same expected version again is stale now: ABORTED, with the reason and the
	// current version in the ErrorInfo of the status details.
	_, err = transcript.AppendEntries(ctx, &transcriptv1.AppendEntriesRequest{
		Namespace:       namespace,
		ConversationId:  id,
		ExpectedVersion: proto.Int64(conversation.GetVersion()),
		Messages:        []*commonv1.Message{{Role: commonv1.Role_ROLE_USER, Text: "late"}},
	})
	info, code := errorInfo(err)
	if info == nil {
		return fmt.Errorf("a stale append: want an ErrorInfo, got %v", err)
	}
	fmt.Printf("conflict code %s reason %s current_version %s\n",
		code, info.GetReason(), info.GetMetadata()["current_version"])

	upserted, err := memory.UpsertMemory(ctx, &memoryv1.UpsertMemoryRequest{
		Namespace: namespace,
		Content:   "The team ships on Friday.",
		Sources: []*memoryv1.MemorySource{{
			ConversationId:  id,
			FromSequence:    appended.GetFirstSequence(),
			ThroughSequence: appended.GetLastSequence(),
		}},
		RequestId: requestID(),
	})
	if err != nil {
		return fmt.Errorf("UpsertMemory: %w", err)
	}
	stored := upserted.GetMemory()
	source := stored.GetSources()[0]
	fmt.Printf("memory %s revision %d from %s sequences %d..%d\n", stored.GetMemoryId(),
		stored.GetRevision(), source.GetConversationId(), source.GetFromSequence(),
		source.GetThroughSequence())

	results, err := searchUntilFound(ctx, memory, namespace, "when do we ship", stored.GetMemoryId())
	if err != nil {
		return err
	}
	for _, hit := range results {
		fmt.Printf("found %s score %.3f %q\n", hit.GetMemory().GetMemoryId(), hit.GetScore(),
			hit.GetMemory().GetContent())
	}
	return nil
}

// errorInfo is the google.rpc.ErrorInfo among the details of err's gRPC status (nil when
// err carries none), and the status code.
func errorInfo(err error) (*errdetails.ErrorInfo, string) {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return nil, ""
	}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info, st.Code().String()
		}
	}
	return nil, st.Code().String()
}

// searchUntilFound searches until the memory is among the results: the index is kept
// from PostgreSQL's outbox, so a new memory is searchable moments after its write.
func searchUntilFound(ctx context.Context, memory memoryv1.MemoryServiceClient, namespace,
	query, want string) ([]*memoryv1.ScoredMemory, error) {
	for {
		reply, err := memory.SearchMemories(ctx, &memoryv1.SearchMemoriesRequest{
			Namespace: namespace,
			Query:     query,
			Limit:     3,
		})
		if err != nil {
			return nil, fmt.Errorf("SearchMemories: %w", err)
		}
		for _, hit := range reply.GetResults() {
			if hit.GetMemory().GetMemoryId() == want {
				return reply.GetResults(), nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("SearchMemories: the memory was not found before the deadline")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// requestID is a fresh idempotency key (AIP-155): 32 hexadecimal characters.
func requestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
