package controlapi

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// Request classes of the edge-control API. Each is admitted within its own
// bound of requests in work at once, so that a burst of one (the acks
// after a publish, a fleet re-enrolling) cannot take the replica from the
// others.
const (
	ClassEnroll = "enroll" // POST /v1/enroll
	ClassRenew  = "renew"  // POST /v1/renew
	ClassPoll   = "poll"   // GET /v1/manifest without a cursor (a hold is not work: not counted)
	ClassStatus = "status" // POST /v1/status
	ClassAck    = "ack"    // POST /v1/acks and task acks
	ClassElect  = "elect"  // egress elections and fences
	ClassFetch  = "fetch"  // manifest pages after the first, artifacts, snapshots, front doors
	ClassTasks  = "tasks"  // GET /v1/tasks/
)

// Classes lists the request classes.
var Classes = []string{ClassEnroll, ClassRenew, ClassPoll, ClassStatus, ClassAck, ClassElect, ClassFetch, ClassTasks}

// DefaultAdmission is each class's bound of requests in work at once, for
// one replica on 2 cores: the CPU-heavy ones (a CSR checked and a
// certificate signed) low, the ones that wait on a group commit (acks,
// status) high, as they mostly wait.
var DefaultAdmission = Admission{
	ClassEnroll: 16, ClassRenew: 16, ClassPoll: 512, ClassStatus: 512,
	ClassAck: 1024, ClassElect: 64, ClassFetch: 256, ClassTasks: 64,
}

// MaxAdmission bounds any class's limit.
const MaxAdmission = 100000

// Admission maps a request class to its bound of requests in work at
// once; a class missing or zero has its DefaultAdmission.
type Admission map[string]int

// ParseAdmission reads "class=N,class=N" (commas or spaces).
func ParseAdmission(s string) (Admission, error) {
	a := Admission{}
	for _, kv := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return nil, fmt.Errorf("admission %q: want class=N", kv)
		}
		a[k] = n
	}
	return a, a.validate()
}

func (a Admission) validate() error {
	for k, n := range a {
		if _, ok := DefaultAdmission[k]; !ok {
			return fmt.Errorf("admission: unknown request class %q (want one of %s)", k, strings.Join(Classes, ", "))
		}
		if n < 0 || n > MaxAdmission {
			return fmt.Errorf("admission: %s=%d: want 1–%d (0 for the default, %d)", k, n, MaxAdmission, DefaultAdmission[k])
		}
	}
	return nil
}

// String is the limits as ParseAdmission reads them, classes sorted.
func (a Admission) String() string {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.Itoa(a[k])
	}
	return strings.Join(parts, ",")
}

// admitter holds a semaphore per class.
type admitter struct {
	limits Admission
	sems   map[string]chan struct{}
}

func newAdmitter(a Admission) (*admitter, error) {
	if err := a.validate(); err != nil {
		return nil, fmt.Errorf("controlapi: %w", err)
	}
	ad := &admitter{limits: Admission{}, sems: map[string]chan struct{}{}}
	for k, def := range DefaultAdmission {
		n := a[k]
		if n == 0 {
			n = def
		}
		ad.limits[k] = n
		ad.sems[k] = make(chan struct{}, n)
	}
	return ad, nil
}

// slot is one admitted request's place in its class: released when the
// request ends, or earlier while it is held on purpose (a long poll).
type slot struct {
	sem chan struct{}

	mu   sync.Mutex // guards held
	held bool
}

func (s *slot) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held {
		<-s.sem
		s.held = false
	}
}

// take takes the slot again, or reports the class full.
func (s *slot) take() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held {
		return true
	}
	select {
	case s.sem <- struct{}{}:
		s.held = true
		return true
	default:
		return false
	}
}

type slotKey struct{}

// requestSlot is r's admission slot, or nil.
func requestSlot(r *http.Request) *slot {
	s, _ := r.Context().Value(slotKey{}).(*slot)
	return s
}

// retryAfter is a Retry-After in whole seconds, 1–5 at random: refused
// edges come back spread out, not together.
func retryAfter() int { return 1 + rand.N(5) }

// refuse answers 429 with a random Retry-After, counted by class and
// reason (class_full, edge_rate).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, class, reason, msg string) {
	secs := retryAfter()
	s.metrics.Refused(class, reason)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": fmt.Sprintf("%s: retry in %ds", msg, secs)})
}

// admit serves h within the bound of the class classify gives r;
// beyond it, 429 with Retry-After, before anything else is done (no
// database read, no certificate check).
func (s *Server) admit(classify func(*http.Request) string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		class := classify(r)
		sl := &slot{sem: s.admission.sems[class]}
		if !sl.take() {
			s.log.Debug("request class at its limit", zap.String("class", class), zap.String("path", r.URL.Path))
			s.refuse(w, r, class, "class_full", fmt.Sprintf("the control API is serving its limit of %d %s requests", s.admission.limits[class], class))
			return
		}
		defer sl.release()
		h(w, r.WithContext(context.WithValue(r.Context(), slotKey{}, sl)))
	}
}

// class is a classifier of one class.
func class(c string) func(*http.Request) string { return func(*http.Request) string { return c } }

// pollClass: a manifest request without a cursor is a poll, one with a
// cursor fetches a page.
func pollClass(r *http.Request) string {
	if r.URL.Query().Get("cursor") != "" {
		return ClassFetch
	}
	return ClassPoll
}

// unheld gives back r's slot while it is held on purpose (a long poll's
// hold is a wait, not work).
func unheld(r *http.Request) {
	if sl := requestSlot(r); sl != nil {
		sl.release()
	}
}

// reheld takes r's slot back after its hold, or answers that its class is
// full (the edge polls again after Retry-After: nothing is lost).
func (s *Server) reheld(w http.ResponseWriter, r *http.Request) bool {
	sl := requestSlot(r)
	if sl == nil || sl.take() {
		return true
	}
	s.refuse(w, r, ClassPoll, "class_full", fmt.Sprintf("the control API is serving its limit of %d poll requests", s.admission.limits[ClassPoll]))
	return false
}
