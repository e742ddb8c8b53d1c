package controlapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"go.uber.org/zap"

	"cellvisor/controlapi/store"
)

// apiError is an error with the status and message a client sees.
type apiError struct {
	Status  int
	Message string
	Err     error
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *apiError) Unwrap() error { return e.Err }

func errorf(status int, format string, args ...any) error {
	return &apiError{Status: status, Message: fmt.Sprintf(format, args...)}
}

// handlerFunc is an HTTP handler that returns its error, for one place to
// turn errors into responses.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) handle(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var ae *apiError
		switch {
		case errors.As(err, &ae):
		case errors.Is(err, store.ErrNotFound):
			ae = &apiError{Status: http.StatusNotFound, Message: err.Error()}
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrUnavailable):
			ae = &apiError{Status: http.StatusConflict, Message: err.Error()}
		case errors.Is(err, store.ErrInvalid):
			ae = &apiError{Status: http.StatusBadRequest, Message: err.Error()}
		case errors.Is(err, store.ErrStopped):
			w.Header().Set("Retry-After", "5") // a replica shutting down: the agent retries
			ae = &apiError{Status: http.StatusServiceUnavailable, Message: "the control API is stopping"}
		case r.Context().Err() != nil:
			return // the client went away
		default:
			s.log.Error("request failed", zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Error(err))
			ae = &apiError{Status: http.StatusInternalServerError, Message: "internal error"}
		}
		writeJSON(w, ae.Status, map[string]string{"error": ae.Message})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}

// decode strictly decodes a JSON body of at most max bytes into v.
func decode(r *http.Request, max int64, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return errorf(http.StatusBadRequest, "read body: %v", err)
	}
	if int64(len(data)) > max {
		return errorf(http.StatusRequestEntityTooLarge, "body over %d bytes", max)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "decode body: %v", err)
	}
	if dec.More() {
		return errorf(http.StatusBadRequest, "decode body: trailing data")
	}
	return nil
}
