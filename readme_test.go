package krcore_test

import (
	"os"
	"strings"
	"testing"
)

// codeBlocks returns the fenced blocks of a Markdown text written in lang,
// in order, each as its lines.
func codeBlocks(text, lang string) [][]string {
	var blocks [][]string
	var cur []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case !in && line == "```"+lang:
			in, cur = true, nil
		case in && line == "```":
			in = false
			blocks = append(blocks, cur)
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// code is a line without its trailing comment and surrounding space.
func code(line string) string {
	if i := strings.Index(line, "//"); i >= 0 {
		line = line[:i]
	}
	return strings.TrimSpace(line)
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The README's example is the package's Example, compiled and run by go
// test: every line of README's Go block (comments aside) must appear in
// example_test.go, in the same order, so the example a user reads first
// cannot drift from code that compiles and runs.
func TestREADMEExampleIsExampleTest(t *testing.T) {
	blocks := codeBlocks(readText(t, "README.md"), "go")
	if len(blocks) != 1 {
		t.Fatalf("README.md has %d Go blocks, want 1 (the example)", len(blocks))
	}
	var example []string
	for _, l := range strings.Split(readText(t, "example_test.go"), "\n") {
		example = append(example, code(l))
	}
	next := 0
	for _, l := range blocks[0] {
		want := code(l)
		if want == "" {
			continue
		}
		for next < len(example) && example[next] != want {
			next++
		}
		if next == len(example) {
			t.Fatalf("README's example line %q is not in example_test.go (after the lines before it)", strings.TrimSpace(l))
		}
		next++
	}
}

// README opens with two commands, the main job and the tests, and .ci/run
// runs exactly the test command README gives.
func TestREADMETestCommandIsCI(t *testing.T) {
	readme := readText(t, "README.md")
	blocks := codeBlocks(readme, "sh")
	if len(blocks) == 0 || !strings.HasPrefix(readme, "# krcore\n\n```sh\n") {
		t.Fatal("README.md does not open with a sh block of commands")
	}
	if len(blocks[0]) != 2 {
		t.Fatalf("README's first block has %d commands, want 2 (main job, tests)", len(blocks[0]))
	}
	test := blocks[0][1]
	if i := strings.Index(test, "#"); i >= 0 {
		test = test[:i]
	}
	test = strings.TrimSpace(test)
	if !strings.HasPrefix(test, "go test ") {
		t.Fatalf("README's second command %q is not a go test command", test)
	}
	for _, l := range strings.Split(readText(t, ".ci/run"), "\n") {
		if strings.TrimSpace(l) == test {
			return
		}
	}
	t.Fatalf(".ci/run does not run README's test command %q on a line of its own", test)
}
