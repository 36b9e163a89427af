// Package docs holds no code: its tests check the Markdown pages of the
// repository against the code. Every qualified name a page cites must be
// exported (TestMarkdownNamesExist), and every ```go block of README.md
// and docs/*.md must compile (TestGoSnippetsCompile; the names a page
// leaves to the reader are declared in preludes_test.go).
package docs
