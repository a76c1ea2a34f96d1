package tools

import (
	"context"

	"github.com/honestcancel/gateway/chat"
)

// progressKey carries a call's progress sink in its context.
type progressKey struct{}

// WithProgress returns ctx carrying report, which a tool called with it
// may call with its progress (an MCP server's progress notifications).
// report must not block: the engine gives one that keeps the latest
// report and records it at its own pace.
func WithProgress(ctx context.Context, report func(chat.ToolProgress)) context.Context {
	return context.WithValue(ctx, progressKey{}, report)
}

// ProgressReporter returns the sink of ctx (see WithProgress), or nil.
func ProgressReporter(ctx context.Context) func(chat.ToolProgress) {
	f, _ := ctx.Value(progressKey{}).(func(chat.ToolProgress))
	return f
}
