package controlapi

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"cellvisor/controlapi/adminapi"
	"cellvisor/controlapi/store"
	"cellvisor/domain"
)

// continents are the seven continent codes.
var continents = map[string]string{
	"AF": "Africa", "AN": "Antarctica", "AS": "Asia", "EU": "Europe", "NA": "North America", "OC": "Oceania", "SA": "South America",
}

// countries are the officially assigned ISO 3166-1 alpha-2 codes.
var countries = func() map[string]bool {
	const codes = `AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ
CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF
GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP KR KW
KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT MU MV MW MX MY MZ NA NC NE NF NG NI NL
NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST
SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW`
	m := map[string]bool{}
	for _, c := range strings.Fields(codes) {
		m[c] = true
	}
	return m
}()

// validName reports 1–max lowercase letters, digits and inner hyphens or
// dots (domain.ValidName): a name that reads well in a table and a log line.
func validName(s string, max int) bool { return domain.ValidName(s, max) }

// validateEdge checks every field of a new edge and fills the defaults,
// naming the field it refuses.
func validateEdge(r *adminapi.EdgeRequest) error {
	bad := func(field, format string, args ...any) error {
		return errorf(http.StatusBadRequest, "%s: %s", field, fmt.Sprintf(format, args...))
	}
	r.Country, r.Continent = strings.ToUpper(r.Country), strings.ToUpper(r.Continent)
	if r.Slots == 0 {
		r.Slots = adminapi.DefaultSlots
	}
	switch {
	case !validName(r.Name, 63):
		return bad("name", "%q: want 1–63 lowercase letters, digits, '-' or '.', not at either end", r.Name)
	case !validName(r.Org, 63):
		return bad("org", "%q: want 1–63 lowercase letters, digits, '-' or '.', not at either end", r.Org)
	case !countries[r.Country]:
		return bad("country", "%q is not an ISO 3166-1 alpha-2 code", r.Country)
	case continents[r.Continent] == "":
		return bad("continent", "%q: want one of AF, AN, AS, EU, NA, OC, SA", r.Continent)
	case r.Slots < 1 || r.Slots > 32:
		return bad("slots", "%d: want 1–32", r.Slots)
	}
	if err := applyTopology(r.EdgeUpdateRequest, new(store.Topology)); err != nil {
		return err
	}
	if r.MgmtIPv4 != "" {
		a, err := netip.ParseAddr(r.MgmtIPv4)
		if err != nil || !a.Is4() {
			return bad("mgmt_ipv4", "%q is not an IPv4 address", r.MgmtIPv4)
		}
		r.MgmtIPv4 = a.String()
	}
	if r.MgmtIPv6 != "" {
		a, err := netip.ParseAddr(r.MgmtIPv6)
		if err != nil || !a.Is6() || a.Is4In6() || a.Zone() != "" {
			return bad("mgmt_ipv6", "%q is not an IPv6 address", r.MgmtIPv6)
		}
		r.MgmtIPv6 = a.String()
	}
	return nil
}

// validCell reports cell-01 … cell-NN for an edge of slots slots.
func validCell(cell string, slots int) bool {
	for i := 1; i <= slots; i++ {
		if cell == fmt.Sprintf("cell-%02d", i) {
			return true
		}
	}
	return false
}
