//go:build race

package controlapi_test

// raceDetector is whether the tests run under the race detector, which
// multiplies memory and time: memory measurements skip themselves then.
const raceDetector = true
