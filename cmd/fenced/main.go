// Command fenced runs commands under fenced leases and administers lease
// stores.
//
//	fenced run KEY [--] COMMAND [ARGS...] run COMMAND while holding a lease on KEY
//	fenced run -n N NAME -- COMMAND       up to N at once, a lease per permit
//	fenced run KEY1 KEY2 -- COMMAND       leases on every key, canonical order
//	fenced elect NAME -- COMMAND          run COMMAND while leader of NAME
//	fenced observe NAME                   print each change of NAME's leader
//	fenced ls [PREFIX]                    list held leases
//	fenced inspect KEY                    show one key: holder, fence, time left, breaks
//	fenced break KEY --reason TEXT        end a lease whoever holds it
//	fenced guarantees                     what the store promises
//	fenced floor [raise N|--from STORE]   show or raise the fence floor (SQL stores)
//	fenced prune --older-than DURATION    delete unused keys' rows, keeping fences increasing
//	fenced demo [--no-fence]              the billing scenario, run for real
//	fenced plan --ttl 30s [--max-pause D] size a lease: freeze absorbed, stale window, recovery
//	fenced serve [--addr A] [--admin-token-file F]  HTTP API, metrics and live dashboard
//
// The store is chosen with --store or FENCED_STORE; the default is the
// embedded SQLite file under the invoking user's state directory, so it is
// per user (-v prints the store used).
//
// fenced run owns COMMAND's whole process tree (a process group, with
// fenced as child subreaper): on loss it sends SIGTERM and, after --grace,
// SIGKILL to every process, and it releases the lease only when none is
// left; it stops and continues together with COMMAND; and COMMAND dies with
// fenced. See fenced run --help and internal/cli/supervise.
//
// Exit codes of fenced run: the child's own code when it ran and its lease
// held until its last process ended; 75 when the key was held and the wait
// ran out (nothing ran); 77 when the lease was lost, or could not be
// confirmed, before that; 69 when the store was unavailable; 64 for usage
// errors; 127 when COMMAND could not be started; 1 for other errors.
// fenced's own codes come with a last stderr line "fenced: ... (exit N)";
// a code passed on from COMMAND comes without one.
package main

import (
	"fmt"
	"os"

	"github.com/fenced-dev/fenced/internal/cli/proof"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
)

func main() {
	supervise.MaybeRunGuard() // this process may be fenced run's guard
	os.Exit(traceExit(execute(os.Args[1:], os.Stdout, os.Stderr)))
}

// exitTraceEnv names a file that, when set, gets fenced's exit code and
// when it chose it (CLOCK_MONOTONIC ns), for tests that time fenced apart
// from the kernel's teardown of the process, which takes up to seconds
// on a busy machine.
const exitTraceEnv = "FENCED_EXIT_TRACE"

// traceExit records code as exitTraceEnv asks, and returns it.
func traceExit(code int) int {
	if f := os.Getenv(exitTraceEnv); f != "" {
		_ = os.WriteFile(f, fmt.Appendf(nil, "%d %d\n", code, proof.Now()), 0o644)
	}
	return code
}
