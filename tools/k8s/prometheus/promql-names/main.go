// promql-names reads PromQL expressions on stdin, one a line (blank lines and lines
// starting with # are skipped), parses each with Prometheus' own parser and prints,
// for each, one line: the metric names it selects, space-separated and sorted, or
// "error: <message>" when it does not parse. It exits 1 when any expression failed.
package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

func names(expr string) ([]string, error) {
	node, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, sel := range parser.ExtractSelectors(node) {
		found := false
		for _, m := range sel {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				seen[m.Value] = true
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("a selector without a literal metric name: %v", sel)
		}
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

func main() {
	failed := false
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		got, err := names(line)
		if err != nil {
			failed = true
			fmt.Printf("error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		fmt.Println(strings.Join(got, " "))
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}
