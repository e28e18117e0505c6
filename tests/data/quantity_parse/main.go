// Command quantity_parse runs quantities through apimachinery's own resource.ParseQuantity: one JSON
// string a line in, one JSON object a line out ({"quantity", "valid", "value", "canonical"}). Given a
// regular expression as its argument, it also says whether Go's regexp (RE2, as an API server compiles a
// CRD's pattern) matches each quantity ("patternMatches").
// tests/unit/test_quantity.py checks tests/data/quantities.yaml with it.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"k8s.io/apimachinery/pkg/api/resource"
)

type result struct {
	Quantity  string `json:"quantity"`
	Valid     bool   `json:"valid"`
	Value     string `json:"value,omitempty"`
	Canonical string `json:"canonical,omitempty"`
	Pattern   *bool  `json:"patternMatches,omitempty"`
}

func main() {
	var pattern *regexp.Regexp
	if len(os.Args) > 1 {
		pattern = regexp.MustCompile(os.Args[1])
	}
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var text string
		if err := json.Unmarshal(in.Bytes(), &text); err != nil {
			fmt.Fprintln(os.Stderr, "quantity_parse: each line must be a JSON string:", err)
			os.Exit(2)
		}
		r := result{Quantity: text}
		if q, err := resource.ParseQuantity(text); err == nil {
			r.Valid, r.Value, r.Canonical = true, q.AsDec().String(), q.String()
		}
		if pattern != nil {
			matches := pattern.MatchString(text)
			r.Pattern = &matches
		}
		if err := out.Encode(r); err != nil {
			os.Exit(1)
		}
	}
}
