package agent

import (
	"testing"
	"time"
)

// The agent lets the control API hold a poll 90 s, within half of
// source.poll_timeout, which bounds the whole poll.
func TestLongPollWithinThePollTimeout(t *testing.T) {
	for _, tc := range []struct {
		name        string
		pollTimeout time.Duration
		want        time.Duration
	}{
		{"default poll timeout", 10 * time.Minute, 90 * time.Second},
		{"short poll timeout", time.Minute, 30 * time.Second},
		{"shortest poll timeout", time.Second, 500 * time.Millisecond}, // under a second: plain polls
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := longPoll(tc.pollTimeout); got != tc.want {
				t.Fatalf("longPoll(%s) = %s, want %s", tc.pollTimeout, got, tc.want)
			}
		})
	}
}
