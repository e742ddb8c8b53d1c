package acmeissue

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/acme"
)

// Problem is one RFC 8555 problem document from the CA: what the control
// API reports when issuance fails.
type Problem struct {
	// Type is the problem's URN, e.g.
	// "urn:ietf:params:acme:error:unauthorized"; empty when the CA gave
	// none.
	Type string `json:"type,omitempty"`
	// Detail is the CA's explanation.
	Detail string `json:"detail"`
	// Hostname is the identifier a subproblem names, if any.
	Hostname string `json:"hostname,omitempty"`
}

// Error is a step of an order that the CA refused or failed, with its
// problems.
type Error struct {
	// Step is the order's step: register, new order, authorization,
	// accept challenge, validate, order, finalize.
	Step string
	// Hostname is the hostname whose authorization failed, if one did.
	Hostname string
	// Status is the CA's HTTP status, or 0.
	Status int
	// Problems are what the CA said, at least one.
	Problems []Problem
	// Err is the client's error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Step)
	if e.Hostname != "" {
		b.WriteString(" " + e.Hostname)
	}
	for i, p := range e.Problems {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		if p.Hostname != "" && p.Hostname != e.Hostname {
			b.WriteString(p.Hostname + ": ")
		}
		if p.Type != "" {
			b.WriteString(p.Type + ": ")
		}
		b.WriteString(p.Detail)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Problems returns the CA's problems in err's chain, or nil.
func Problems(err error) []Problem {
	var e *Error
	if errors.As(err, &e) {
		return e.Problems
	}
	return nil
}

// problemErr turns the client's error into an *Error when the CA sent a
// problem (an *acme.Error, an invalid authorization or order); other
// errors (the network, the context) come back wrapped with the step.
func problemErr(step, host string, err error) error {
	e := &Error{Step: step, Hostname: host, Err: err}
	var ae *acme.Error
	var aze *acme.AuthorizationError
	var oe *acme.OrderError
	switch {
	case errors.As(err, &aze):
		if e.Hostname == "" {
			e.Hostname = aze.Identifier
		}
		for _, ce := range aze.Errors {
			e.Problems = append(e.Problems, fromACME(ce)...)
		}
	case errors.As(err, &oe):
		if oe.Problem != nil {
			e.Status = oe.Problem.StatusCode
			e.Problems = fromACME(oe.Problem)
		} else {
			e.Problems = []Problem{{Detail: "order is " + oe.Status}}
		}
	case errors.As(err, &ae):
		e.Status = ae.StatusCode
		e.Problems = fromACME(ae)
	default:
		return fmt.Errorf("%s: %w", step, err)
	}
	if len(e.Problems) == 0 {
		e.Problems = []Problem{{Detail: err.Error()}}
	}
	return e
}

// fromACME reads a problem and its subproblems.
func fromACME(err error) []Problem {
	var ae *acme.Error
	if !errors.As(err, &ae) {
		return []Problem{{Detail: err.Error()}}
	}
	ps := []Problem{{Type: ae.ProblemType, Detail: ae.Detail}}
	for _, sp := range ae.Subproblems {
		p := Problem{Type: sp.Type, Detail: sp.Detail}
		if sp.Identifier != nil {
			p.Hostname = sp.Identifier.Value
		}
		ps = append(ps, p)
	}
	return ps
}
