package engine_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the engine starts is owned and waited for: none may be
// left once the tests closed their engines and stores.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
