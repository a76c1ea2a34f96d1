package store

// SetPurgeLimits makes retention work in transactions of batch rows, at
// most maxBatches per call, until the test ends (restore).
func SetPurgeLimits(batch, maxBatches int) (restore func()) {
	b, m := purgeBatch, purgeMaxBatches
	purgeBatch, purgeMaxBatches = batch, maxBatches
	return func() { purgeBatch, purgeMaxBatches = b, m }
}

// HoldWriter takes the writer, as a long transaction would, until release.
func (s *Store) HoldWriter() (release func()) {
	s.writeMu.Lock()
	return s.writeMu.Unlock
}

// QueuedWrites is how many grouped writes wait for the writer.
func (s *Store) QueuedWrites() int {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	return len(s.queue.pending)
}
