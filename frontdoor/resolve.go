package frontdoor

import "fmt"

// Reason is why a resolve refused; its values are stable codes shown by the
// admin API, the CLI and the cells' Lua.
type Reason string

// The refusals. Each is final: the caller gets no edge, never a guess.
const (
	// Unmapped: no row's front door is the input's origin.
	Unmapped Reason = "unmapped"
	// Ambiguous: more than one row holds the input's origin (the unique
	// index should make this impossible; a copy of the rows outside the
	// store, like the cells' runtime file, may still carry it).
	Ambiguous Reason = "ambiguous"
	// CorruptRow: a row is damaged (its edge is not an edge id, or its URL
	// is not the canonical origin it must be stored as), so the set cannot
	// be trusted to answer.
	CorruptRow Reason = "corrupt_row"
	// Malformed: the input is not a URL the resolver accepts.
	Malformed Reason = "malformed"
)

// Refusal is a resolve that answers no edge.
type Refusal struct {
	Reason Reason
	Detail string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("front door refused (%s): %s", r.Reason, r.Detail)
}

// Row is one active front door: the edge it maps to and its URL as stored,
// which must be canonical (Normalize(URL) == URL).
type Row struct {
	Edge string `json:"edge"`
	URL  string `json:"url"`
}

// Resolve answers the edge whose front door is raw's origin, or a *Refusal.
// The cascade, in order:
//  1. raw does not normalize: Malformed;
//  2. any row is corrupt (invalid edge id, or a URL that is not its own
//     canonical form): CorruptRow, for every input, since a damaged row may
//     be the one that would have matched;
//  3. no row matches exactly: Unmapped;
//  4. more than one row matches: Ambiguous (even for the same edge: the set
//     breaks the one-URL-one-row rule);
//  5. exactly one: its edge.
//
// It checks every row on each call; NewTable checks them once for many
// resolves against the same rows.
func Resolve(raw string, rows []Row) (string, error) {
	if _, err := Normalize(raw); err != nil {
		return "", err
	}
	return NewTable(rows).Resolve(raw)
}

// Table is a set of rows checked once, to resolve many URLs against.
type Table struct {
	corrupt error               // the first corrupt row, or nil
	byURL   map[string][]string // canonical URL -> the edges of its rows
}

// NewTable checks rows and indexes them by URL.
func NewTable(rows []Row) *Table {
	t := &Table{byURL: make(map[string][]string, len(rows))}
	for i, r := range rows {
		if err := CheckRow(r); err != nil {
			t.corrupt = &Refusal{Reason: CorruptRow, Detail: fmt.Sprintf("row %d: %v", i+1, err)}
			return t
		}
		t.byURL[r.URL] = append(t.byURL[r.URL], r.Edge)
	}
	return t
}

// Resolve is the package's Resolve against the table's rows.
func (t *Table) Resolve(raw string) (string, error) {
	want, err := Normalize(raw)
	if err != nil {
		return "", err
	}
	if t.corrupt != nil {
		return "", t.corrupt
	}
	switch edges := t.byURL[want]; len(edges) {
	case 0:
		return "", &Refusal{Reason: Unmapped, Detail: want + " is no front door"}
	case 1:
		return edges[0], nil
	default:
		return "", &Refusal{Reason: Ambiguous, Detail: fmt.Sprintf("%s is the front door of %d rows", want, len(edges))}
	}
}

// CheckRow returns an error if r could not be stored as a front door.
func CheckRow(r Row) error {
	if !ValidEdge(r.Edge) {
		return fmt.Errorf("edge %q is not an edge id", r.Edge)
	}
	n, err := Normalize(r.URL)
	if err != nil {
		return fmt.Errorf("url %q: %w", r.URL, err)
	}
	if n != r.URL {
		return fmt.Errorf("url %q is not canonical (%s)", r.URL, n)
	}
	return nil
}
