package outbound

import (
	"net/http"
	"sync/atomic"
)

// Intake results, a fixed set: accepted (journaled), or the refusal's
// reason class, from its HTTP status.
const (
	IntakeAccepted        = "accepted"
	IntakeUnauthenticated = "unauthenticated" // 401: no verified client certificate
	IntakeUnknownClass    = "unknown_class"   // 404: no intake for the class here
	IntakeMethod          = "method"          // 405: not a POST
	IntakeInvalid         = "invalid"         // 400: unreadable, undecodable or invalid bundle, wrong class
	IntakeTooLarge        = "too_large"       // 413: over edgeapi.MaxBundleBytes
	IntakeNotHolder       = "not_holder"      // 409: not the holder, a stale lease, a foreign org or origin
	IntakeFenceFailed     = "fence_failed"    // 503: the lease could not be checked with the control API, or the intake is busy
	IntakeJournalFull     = "journal_full"    // 507: the journal is at its bound
	IntakeError           = "error"           // 500: a local error
	IntakePeerBusy        = "peer_busy"       // 429: the peer has its share of forwards in flight
	IntakeSlowBody        = "slow_body"       // 408: the bundle was not read within the send timeout
	IntakePeerRefused     = "peer_refused"    // 403: the control API refuses the peer (another org's, deleted, rotated away)
)

// IntakeResults are the intake results, in the order IntakeCounts returns them.
var IntakeResults = []string{IntakeAccepted, IntakeUnauthenticated, IntakeUnknownClass, IntakeMethod, IntakeInvalid,
	IntakeTooLarge, IntakeNotHolder, IntakeFenceFailed, IntakeJournalFull, IntakeError, IntakePeerBusy, IntakeSlowBody, IntakePeerRefused}

// intakeStats counts the intake's answers since the agent started.
type intakeStats [13]atomic.Int64

// intakeResult is the result class of an intake answer's status.
func intakeResult(code int) int {
	switch code {
	case http.StatusAccepted:
		return 0
	case http.StatusUnauthorized:
		return 1
	case http.StatusNotFound:
		return 2
	case http.StatusMethodNotAllowed:
		return 3
	case http.StatusBadRequest:
		return 4
	case http.StatusRequestEntityTooLarge:
		return 5
	case http.StatusConflict:
		return 6
	case http.StatusServiceUnavailable:
		return 7
	case http.StatusInsufficientStorage:
		return 8
	case http.StatusTooManyRequests:
		return 10
	case http.StatusRequestTimeout:
		return 11
	case http.StatusForbidden:
		return 12
	}
	return 9
}

func (st *intakeStats) count(code int) { st[intakeResult(code)].Add(1) }

// IntakeCounts returns the intake's answers since the agent started, by
// result (IntakeResults).
func (s *Sender) IntakeCounts() map[string]int64 {
	out := make(map[string]int64, len(IntakeResults))
	for i, r := range IntakeResults {
		out[r] = s.intake[i].Load()
	}
	return out
}
