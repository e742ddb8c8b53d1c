//go:build !race

package controlapi_test

const raceDetector = false
