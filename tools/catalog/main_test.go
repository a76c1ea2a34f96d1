package catalog

import (
	"testing"

	"go.uber.org/goleak"
)

// Goroutines started by this package are owned and waited for.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
