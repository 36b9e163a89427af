// Package docs holds no code: its test checks that the Markdown pages of
// the repository name only identifiers the code exports.
package docs
