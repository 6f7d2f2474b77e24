package streaming

import "sync"

// Broadcast copies what is written to it to every subscriber, without ever blocking the writer:
// a subscriber too slow to keep up loses output rather than stall the stream for everyone.
type Broadcast struct {
	mu     sync.Mutex
	subs   map[chan []byte]struct{}
	closed bool
}

// NewBroadcast returns an open broadcast.
func NewBroadcast() *Broadcast { return &Broadcast{subs: map[chan []byte]struct{}{}} }

// Write hands a copy of p to every subscriber.
func (b *Broadcast) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- append([]byte(nil), p...):
		default:
		}
	}
	return len(p), nil
}

// Subscribe returns a channel of what is written from now on, and the function that ends the
// subscription. The channel is closed at the end of the subscription or of the broadcast.
func (b *Broadcast) Subscribe() (<-chan []byte, func()) {
	ch := make(chan []byte, 256)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(ch)
		return ch, func() {}
	}
	b.subs[ch] = struct{}{}
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if _, ok := b.subs[ch]; ok {
				delete(b.subs, ch)
				close(ch)
			}
		})
	}
}

// Close ends every subscription; later subscribers get a closed channel at once.
func (b *Broadcast) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for ch := range b.subs {
		delete(b.subs, ch)
		close(ch)
	}
}
