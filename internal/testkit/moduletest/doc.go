// Package moduletest holds the test that consumes fenced the way a user
// does: as a module required by version from another module, through a
// module proxy, never through this repository's go.mod. It has no code of
// its own; see moduletest_test.go.
package moduletest
