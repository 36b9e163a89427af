package proof

import (
	"fmt"
	"time"
)

// violations records a generative checker's violations, timed from t0.
// It keeps the first 20 descriptions in *problems.
type violations struct {
	t0       int64
	first    int64  // the earliest violation's instant, -1 if none
	since    string // what t0 starts: "run" or "churn"
	problems *[]string
}

// violation records a violation that happened at at.
func (v *violations) violation(at int64, format string, args ...any) {
	if len(*v.problems) < 20 {
		*v.problems = append(*v.problems,
			fmt.Sprintf("%v into the %s: ", time.Duration(at-v.t0).Round(time.Millisecond), v.since)+fmt.Sprintf(format, args...))
	}
	if v.first < 0 || at < v.first {
		v.first = at
	}
}
