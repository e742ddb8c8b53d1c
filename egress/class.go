// Package egress owns governed egress decisions: the traffic classes, the
// election cascade that chooses one owner per (org, traffic class) from the
// live candidates, and the route a sender takes for a class. It is pure: no
// store, no HTTP, no clock of its own. The control API runs the cascade
// against its store and leases; the agent turns answers into routes.
// controlapi, controlapi/lease, outbound, outbound/outboundtest and
// cmd/cellvisor-control import it.
package egress

import "fmt"

// Class is a kind of outbound traffic. Each class of an org is a separate
// lease scope, so different classes may have different owners.
type Class string

// The traffic classes, exactly the seed's eight.
const (
	ProactiveSupport       Class = "proactive_support"
	Metering               Class = "metering"
	License                Class = "license"
	CapabilityCoordination Class = "capability_coordination"
	DataPlane              Class = "data_plane"
	ModelInference         Class = "model_inference"
	SIEMForwarding         Class = "siem_forwarding"
	Federation             Class = "federation"
)

// Classes lists every traffic class in a stable order.
var Classes = []Class{
	ProactiveSupport, Metering, License, CapabilityCoordination,
	DataPlane, ModelInference, SIEMForwarding, Federation,
}

var publicNames = map[Class]string{
	ProactiveSupport:       "Proactive Support",
	Metering:               "Metering",
	License:                "License",
	CapabilityCoordination: "Capability coordination",
	DataPlane:              "Data plane",
	ModelInference:         "Model inference",
	SIEMForwarding:         "SIEM forwarding",
	Federation:             "Federation",
}

// PublicName is the class's name as operators read it ("SIEM forwarding").
func (c Class) PublicName() string { return publicNames[c] }

// Valid reports one of the eight classes.
func (c Class) Valid() bool { _, ok := publicNames[c]; return ok }

// ParseClass accepts a class's wire name ("siem_forwarding").
func ParseClass(s string) (Class, error) {
	c := Class(s)
	if !c.Valid() {
		return "", fmt.Errorf("unknown traffic class %q", s)
	}
	return c, nil
}
