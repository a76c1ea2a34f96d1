package store

// SetPurgeLimits makes retention work in transactions of batch rows, at
// most maxBatches per call, until the test ends (restore).
func SetPurgeLimits(batch, maxBatches int) (restore func()) {
	b, m := purgeBatch, purgeMaxBatches
	purgeBatch, purgeMaxBatches = batch, maxBatches
	return func() { purgeBatch, purgeMaxBatches = b, m }
}
