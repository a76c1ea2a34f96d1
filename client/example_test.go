package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/client"
)

// A program asks a question over the WebSocket, prints the reply as it
// streams, and stops it after 50 deltas, reading the cancel's receipt.
// (It needs a running gateway, so it is compiled, not run.)
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New("http://127.0.0.1:8080", client.WithBearerToken("tok_….…"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	th, err := c.CreateThread(ctx, "")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := c.Connect(ctx, client.ConnOptions{TabID: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	sub, err := conn.Subscribe(ctx, th.ThreadID, th.LastSeq)
	if err != nil {
		log.Fatal(err)
	}
	run, err := conn.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID,
		ExpectedStateVersion: th.StateVersion, UserMessage: "Explain goroutines and channels"})
	var conflict *client.Error
	if errors.As(err, &conflict) && conflict.Code == chat.CodeStateVersionConflict {
		log.Fatalf("the thread moved on (now version %d): reload it", conflict.CurrentStateVersion)
	} else if err != nil {
		log.Fatal(err)
	}
	deltas := 0
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if ev.Gap != nil {
			// Events were replaced by this snapshot: start over from it.
			deltas = 0
		}
		if d := ev.Delta(); d != nil && ev.RunID == run.RunID {
			fmt.Print(d.Text)
			if deltas++; deltas == 50 {
				if _, err := conn.CancelRun(ctx, client.CancelRunRequest{RunID: run.RunID}); err != nil {
					log.Fatal(err)
				}
			}
		}
		if r := ev.Cancelled(); r != nil && ev.RunID == run.RunID {
			fmt.Printf("\ncancelled: %d characters discarded; continue from %s\n", r.DiscardedStreamChars, r.ResumeCheckpointID)
			return
		}
		if ev.RunID == run.RunID && ev.Type == chat.EventRunCompleted {
			fmt.Println()
			return
		}
	}
}

// A program follows a thread's events over Server-Sent Events from the
// start; the stream resumes by itself after a dropped connection.
func ExampleClient_Events() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:8080")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	stream, err := c.Events(ctx, "thr_…", 0)
	if err != nil {
		log.Fatal(err)
	}
	defer stream.Close()
	for {
		ev, err := stream.Next(ctx)
		if errors.Is(err, client.ErrThreadDeleted) {
			return
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Seq, ev.Type)
	}
}
