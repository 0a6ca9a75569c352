// The Go conformance scenario: the committed stubs (stubs/go) over grpc-go against a
// running server. GOPATH mode: the repo is $GOPATH/src/postbox (tests/sdk/test_polyglot.py
// links it so). Usage: go run scenario.go HOST:PORT PREFIX
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	pb "postbox/stubs/go/postbox/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

var passed int

func step(name string, run func() error) {
	if err := run(); err != nil {
		fmt.Printf("FAILED %s: %v\n%d passed, 1 failed\n", name, err, passed)
		os.Exit(1)
	}
	passed++
	fmt.Printf("ok %s\n", name)
}

func seconds(s int64) *durationpb.Duration { return durationpb.New(time.Duration(s) * time.Second) }

func main() {
	target, prefix := os.Args[1], os.Args[2]
	queue, topic := prefix+"-go", prefix+"-go-topic"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, target, grpc.WithInsecure(), grpc.WithBlock())
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	queues, messages, topics := pb.NewQueueServiceClient(conn), pb.NewMessageServiceClient(conn), pb.NewTopicServiceClient(conn)

	step("create a queue", func() error {
		created, err := queues.CreateQueue(ctx, &pb.CreateQueueRequest{Queue: &pb.Queue{Name: queue}})
		if err == nil && created.GetQueue().GetName() != queue {
			err = fmt.Errorf("created %q", created.GetQueue().GetName())
		}
		return err
	})

	step("SendBatch", func() error {
		var entries []*pb.SendBatchEntry
		for _, body := range []string{"one", "two", "three"} {
			entries = append(entries, &pb.SendBatchEntry{Body: []byte(body)})
		}
		sent, err := messages.SendBatch(ctx, &pb.SendBatchRequest{Queue: queue, Entries: entries})
		if err == nil && len(sent.GetMessageIds()) != 3 {
			err = fmt.Errorf("%d ids", len(sent.GetMessageIds()))
		}
		return err
	})

	step("StreamingReceive with settle", func() error {
		streamCtx, stop := context.WithCancel(ctx)
		defer stop()
		stream, err := messages.StreamingReceive(streamCtx)
		if err != nil {
			return err
		}
		if err := stream.Send(&pb.StreamingReceiveRequest{Queue: queue, MaxMessages: 10, VisibilityTimeout: seconds(30)}); err != nil {
			return err
		}
		var bodies, receipts []string
		for {
			response, err := stream.Recv()
			if err != nil {
				return err
			}
			for _, m := range response.GetBatch().GetMessages() {
				bodies = append(bodies, string(m.GetBody()))
				receipts = append(receipts, m.GetReceipt())
			}
			if settled := response.GetSettleResults(); settled != nil {
				for _, s := range settled.GetDeletes() {
					if s.GetCode() != 0 {
						return fmt.Errorf("delete: %v", s)
					}
				}
				if len(settled.GetDeletes()) != 3 {
					return fmt.Errorf("%d deletes settled", len(settled.GetDeletes()))
				}
				break
			}
			if len(receipts) == 3 {
				if err := stream.Send(&pb.StreamingReceiveRequest{DeleteReceipts: receipts}); err != nil {
					return err
				}
			}
		}
		sort.Strings(bodies)
		if fmt.Sprint(bodies) != "[one three two]" {
			return fmt.Errorf("received %v", bodies)
		}
		return nil
	})

	step("a long-poll Receive answered by a later send", func() error {
		// The queue is empty: the call waits (up to 20 s) until the send below commits.
		stream, err := messages.Receive(ctx, &pb.ReceiveRequest{Queue: queue, MaxMessages: 1, WaitTime: seconds(20)})
		if err != nil {
			return err
		}
		if _, err := messages.Send(ctx, &pb.SendRequest{Queue: queue, Body: []byte("awaited")}); err != nil {
			return err
		}
		response, err := stream.Recv()
		if err != nil {
			return err
		}
		if got := string(response.GetMessages()[0].GetBody()); got != "awaited" {
			return fmt.Errorf("received %q", got)
		}
		_, err = messages.Delete(ctx, &pb.DeleteRequest{Queue: queue, Receipt: response.GetMessages()[0].GetReceipt()})
		return err
	})

	step("a continuous Receive stream woken by a later send", func() error {
		if _, err := messages.Send(ctx, &pb.SendRequest{Queue: queue, Body: []byte("first")}); err != nil {
			return err
		}
		stream, err := messages.Receive(ctx, &pb.ReceiveRequest{
			Queue: queue, MaxMessages: 1, Mode: pb.ReceiveMode_RECEIVE_MODE_CONTINUOUS,
			MaxTotalMessages: proto.Int64(2), IdleTimeout: seconds(20), VisibilityTimeout: seconds(30),
		})
		if err != nil {
			return err
		}
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		// The stream has taken everything there was: only this send can answer it.
		started := time.Now()
		if _, err := messages.Send(ctx, &pb.SendRequest{Queue: queue, Body: []byte("later")}); err != nil {
			return err
		}
		later, err := stream.Recv()
		if err != nil {
			return err
		}
		if got := string(later.GetMessages()[0].GetBody()); got != "later" {
			return fmt.Errorf("received %q", got)
		}
		// Well inside the 20 s idle limit: woken by the send, not by the limit.
		if waited := time.Since(started); waited > 15*time.Second {
			return fmt.Errorf("woken after %v", waited)
		}
		_, err = messages.DeleteBatch(ctx, &pb.DeleteBatchRequest{Queue: queue, Receipts: []string{
			first.GetMessages()[0].GetReceipt(), later.GetMessages()[0].GetReceipt(),
		}})
		return err
	})

	step("Publish to a topic with a queue subscription", func() error {
		if _, err := topics.CreateTopic(ctx, &pb.CreateTopicRequest{Topic: &pb.Topic{Name: topic}}); err != nil {
			return err
		}
		if _, err := topics.CreateSubscription(ctx, &pb.CreateSubscriptionRequest{Subscription: &pb.Subscription{
			Name: "to-queue", Topic: topic, Destination: &pb.Subscription_Queue{Queue: queue},
		}}); err != nil {
			return err
		}
		published, err := topics.Publish(ctx, &pb.PublishRequest{Topic: topic, RoutingKey: "a.b", Body: []byte("news")})
		if err != nil {
			return err
		}
		if len(published.GetMessageIds()) != 1 {
			return fmt.Errorf("published to %d queues", len(published.GetMessageIds()))
		}
		stream, err := messages.Receive(ctx, &pb.ReceiveRequest{Queue: queue, MaxMessages: 1, WaitTime: seconds(10)})
		if err != nil {
			return err
		}
		response, err := stream.Recv()
		if err != nil {
			return err
		}
		if got := string(response.GetMessages()[0].GetBody()); got != "news" {
			return fmt.Errorf("received %q", got)
		}
		return nil
	})

	step("a missing queue is NOT_FOUND", func() error {
		_, err := messages.SendBatch(ctx, &pb.SendBatchRequest{
			Queue: queue + "-missing", Entries: []*pb.SendBatchEntry{{Body: []byte("x")}},
		})
		if status.Code(err) != codes.NotFound {
			return fmt.Errorf("status %v", err)
		}
		return nil
	})

	if _, err := topics.DeleteTopic(ctx, &pb.DeleteTopicRequest{Name: topic}); err != nil {
		panic(err)
	}
	if _, err := queues.DeleteQueue(ctx, &pb.DeleteQueueRequest{Name: queue}); err != nil {
		panic(err)
	}
	fmt.Printf("%d passed, 0 failed\n", passed)
}
