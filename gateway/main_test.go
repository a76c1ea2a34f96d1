package gateway_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the gateway starts (connection readers and writers, the
// WebSocket sweeper, SSE streams) is owned and waited for: none may be left
// once the tests closed their servers, engines and stores.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
