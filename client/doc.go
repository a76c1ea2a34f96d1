// Package client is the Go client of the gateway's wire protocol
// (docs/protocol.md): typed access to every command and event over HTTP,
// Server-Sent Events and WebSocket, with reconnection and replay by seq,
// so that a program can drive the gateway the way its page does.
//
// One Client, three ways in:
//
//   - HTTP: one method per API route (CreateThread, ListThreads, Thread,
//     StartRun, CancelRun, SaveFragment, DeleteDraft, Fork, Checkout,
//     DeleteThread, ConfirmTool, RejectTool, Run, Operations,
//     Checkpoints, History). Answers are the chat package's types.
//   - Events: a thread's Server-Sent Events as a Stream.
//   - Connect: a WebSocket Conn, as a browser tab holds one: the same
//     commands (Conn and Client both implement Commander), each answered
//     by its ack or an *Error, and Subscribe to any number of threads.
//
// # Exactly once, in order
//
// A Stream and each Subscription deliver a thread's events with Next, each
// seq once and in order. When a connection drops — the network, a server
// restart, the server closing a connection that fell behind or reached its
// age limit, or the idle timeout (WithIdleTimeout) — the client reconnects
// with bounded, jittered backoff (WithBackoff) and resumes after the last
// seq it received (Last-Event-ID; subscribe with after_seq). Duplicates are
// dropped and a seq that skips ahead is repaired by resuming again, so the
// caller never sees either (Stats counts them, and counts the drops with
// the last one's reason: a close code and reason, the idle timeout, the
// network's error — worth a log line). When the server can no
// longer replay what was missed (docs/protocol.md invariant 8), it says so with
// a thread.snapshot, which the client delivers with Event.Gap set: the
// caller resets what it built from earlier events, never silently.
//
// A dropped connection never cancels anything on the server. A WebSocket
// command whose connection dropped before its answer returns
// ErrConnectionLost: its outcome is unknown (run.start with a
// ClientRequestID is resent, since the server answers a repeat with the
// same run).
//
// # Errors
//
// Every refusal of the server is an *Error with the HTTP status, the
// protocol's code (chat.Code…), its message and extra fields decoded (a
// state_version_conflict's CurrentStateVersion, CurrentCheckpointID and
// AllowedActions; run_not_active's RunStatus; rate_limited's
// RetryAfter). Get it with errors.As, or its code with ErrorCode.
//
// # Authentication and the edge
//
// A program authenticates with an API token (WithBearerToken), a signed-in
// session's cookie (WithSessionCookie) or, behind the operator's reverse
// proxy in auth mode header, the proxy's user header (WithProxyUser);
// none is needed in auth mode none. The gateway answers only to its own
// host names (DNS rebinding): reaching it by another name or address, send
// one of its names with WithHost. WebSocket handshakes need no Origin; one
// sent (WithOrigin) must be the server's own or one it allows.
//
// # Ownership and concurrency
//
// A Client is safe for concurrent use and owns no goroutine. A Stream owns
// none either: Next reads in its caller's goroutine. A Conn owns exactly
// one goroutine (the reader, which also reconnects); Conn.Close stops it
// and waits for it. Every method of a Conn is safe for concurrent use; the
// Next of one Subscription or one Stream must not be called concurrently
// with itself, while their other methods (and Close) may be called from
// any goroutine. Whoever opens a Stream or Conn closes it.
//
// # Example
//
//	c, _ := client.New("http://127.0.0.1:8080", client.WithBearerToken(token))
//	defer c.Close()
//	th, _ := c.CreateThread(ctx, "")
//	conn, _ := c.Connect(ctx, client.ConnOptions{TabID: "my-program"})
//	defer conn.Close()
//	sub, _ := conn.Subscribe(ctx, th.ThreadID, th.LastSeq)
//	run, _ := conn.StartRun(ctx, client.StartRunRequest{ThreadID: th.ThreadID,
//		ExpectedStateVersion: th.StateVersion, UserMessage: "Explain goroutines"})
//	for {
//		ev, err := sub.Next(ctx)
//		if err != nil {
//			return err
//		}
//		if d := ev.Delta(); d != nil {
//			fmt.Print(d.Text)
//		}
//		if ev.RunID == run.RunID && ev.Type == chat.EventRunCompleted {
//			break
//		}
//	}
package client
