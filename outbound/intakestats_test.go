package outbound

import (
	"net/http"
	"testing"
	"time"

	"cellvisor/edgeapi"
)

// Every intake answer's status falls in one result class, each class is
// reachable, and they line up with IntakeResults.
func TestIntakeResultClasses(t *testing.T) {
	codes := map[int]string{
		http.StatusAccepted: IntakeAccepted, http.StatusUnauthorized: IntakeUnauthenticated, http.StatusNotFound: IntakeUnknownClass,
		http.StatusMethodNotAllowed: IntakeMethod, http.StatusBadRequest: IntakeInvalid, http.StatusRequestEntityTooLarge: IntakeTooLarge,
		http.StatusConflict: IntakeNotHolder, http.StatusServiceUnavailable: IntakeFenceFailed, http.StatusInsufficientStorage: IntakeJournalFull,
		http.StatusInternalServerError: IntakeError, http.StatusTeapot: IntakeError, http.StatusTooManyRequests: IntakePeerBusy,
		http.StatusRequestTimeout: IntakeSlowBody, http.StatusForbidden: IntakePeerRefused,
	}
	if len(IntakeResults) != len(intakeStats{}) {
		t.Fatalf("%d results, %d counters", len(IntakeResults), len(intakeStats{}))
	}
	reached := map[string]bool{}
	for code, want := range codes {
		if got := IntakeResults[intakeResult(code)]; got != want {
			t.Errorf("HTTP %d: %s, want %s", code, got, want)
		}
		reached[want] = true
	}
	for _, r := range IntakeResults {
		if !reached[r] {
			t.Errorf("result %s is never reached", r)
		}
	}
}

// The holder's intake counts what it accepted, a non-holder's what it
// refused, on real intakes over mutual TLS.
func TestIntakeCounts(t *testing.T) {
	_, a, b := twoEdges(t)
	bundle := func(from *edge) edgeapi.Bundle {
		bd, err := NewBundle(org, from.id, "metering", time.Now(), []Metering{{Cell: "cell-01", Requests: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return bd
	}
	for range 2 {
		if code, reason, err := postIntake(t, a, b.id, bundle(b), peerTLS(t, b.identity)); err != nil || code != http.StatusAccepted {
			t.Fatalf("forward to the holder: HTTP %d %s %v", code, reason, err)
		}
	}
	if code, _, err := postIntake(t, b, a.id, bundle(a), peerTLS(t, a.identity)); err != nil || code != http.StatusConflict {
		t.Fatalf("forward to a non-holder: HTTP %d %v, want 409", code, err)
	}
	if got := a.sender.IntakeCounts(); got[IntakeAccepted] != 2 || got[IntakeNotHolder] != 0 {
		t.Errorf("holder's intake counts %v: want 2 accepted, none refused", got)
	}
	if got := b.sender.IntakeCounts(); got[IntakeAccepted] != 0 || got[IntakeNotHolder] != 1 || len(got) != len(IntakeResults) {
		t.Errorf("non-holder's intake counts %v: want 1 not_holder, every result present", got)
	}
}
