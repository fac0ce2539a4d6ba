package depcheck

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The package graph docs/architecture.md draws is checked against the
// code: every arrow between two drawn packages is a direct import, and
// every direct import between two drawn packages is an arrow. pkg/api is
// drawn without arrows (every package may import it), and so is a package
// whose imports the page explains in prose instead.

var (
	mermaidNode  = regexp.MustCompile(`^\s*(\w+)\["([^"<]+)`)
	mermaidArrow = regexp.MustCompile(`^\s*(\w+)\s*-->\s*(.+)$`)
)

// drawnGraph reads the diagram: node ids to packages (module-relative),
// and the arrows as "from -> to" of node ids.
func drawnGraph(t *testing.T) (nodes map[string][]string, arrows map[[2]string]bool) {
	t.Helper()
	data, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "```mermaid\n")
	diagram, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/architecture.md has no mermaid diagram")
	}
	nodes, arrows = map[string][]string{}, map[[2]string]bool{}
	for _, line := range strings.Split(diagram, "\n") {
		if m := mermaidArrow.FindStringSubmatch(line); m != nil {
			for _, to := range strings.Split(m[2], "&") {
				arrows[[2]string{m[1], strings.TrimSpace(to)}] = true
			}
			continue
		}
		if m := mermaidNode.FindStringSubmatch(line); m != nil {
			for _, p := range strings.Split(m[2], ",") {
				nodes[m[1]] = append(nodes[m[1]], strings.TrimSpace(p))
			}
		}
	}
	return nodes, arrows
}

func TestTheArchitectureMapIsTrue(t *testing.T) {
	g := listModule(t)
	nodes, arrows := drawnGraph(t)
	nodeOf := map[string]string{}
	for id, pkgs := range nodes {
		for _, p := range pkgs {
			if _, ok := g.all[module+p]; !ok {
				t.Errorf("docs/architecture.md draws %s (%s), which is no package", p, id)
			}
			nodeOf[p] = id
		}
	}
	for a := range arrows {
		for _, id := range a {
			if _, ok := nodes[id]; !ok {
				t.Errorf("docs/architecture.md draws an arrow from or to %q, which is no node", id)
			}
		}
	}
	imported := map[[2]string]bool{}
	for _, p := range g.module {
		from, ok := nodeOf[strings.TrimPrefix(p.ImportPath, module)]
		if !ok || from == "api" {
			continue
		}
		for _, imp := range p.Imports {
			to, ok := nodeOf[strings.TrimPrefix(imp, module)]
			if ok && to != from && to != "api" {
				imported[[2]string{from, to}] = true
			}
		}
	}
	for _, a := range sortedPairs(arrows) {
		if !imported[a] {
			t.Errorf("docs/architecture.md draws %s --> %s, but %s does not import %s", a[0], a[1], nodes[a[0]][0], nodes[a[1]][0])
		}
	}
	for _, a := range sortedPairs(imported) {
		if !arrows[a] {
			t.Errorf("%s imports %s, but docs/architecture.md draws no arrow %s --> %s", nodes[a[0]][0], nodes[a[1]][0], a[0], a[1])
		}
	}
	// Every internal package is named on the page, in the diagram or the
	// text around it.
	page, _ := os.ReadFile("../../docs/architecture.md")
	for _, p := range g.module {
		rel := strings.TrimPrefix(p.ImportPath, module)
		if strings.HasPrefix(rel, "internal/") && strings.Count(rel, "/") == 1 && !strings.Contains(string(page), "`"+rel+"`") && nodeOf[rel] == "" {
			t.Errorf("docs/architecture.md does not name %s", rel)
		}
	}
}

func sortedPairs(m map[[2]string]bool) [][2]string {
	var out [][2]string
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b [2]string) int { return strings.Compare(a[0]+" "+a[1], b[0]+" "+b[1]) })
	return out
}
