// Command fenced runs commands under fenced leases and administers lease
// stores.
//
//	fenced run KEY -- COMMAND [ARGS...]   run COMMAND while holding a lease on KEY
//	fenced ls [PREFIX]                    list held leases
//	fenced inspect KEY                    show one key: holder, fence, time left, breaks
//	fenced break KEY --reason TEXT        end a lease whoever holds it
//	fenced guarantees                     what the store promises
//	fenced floor [raise N|--from STORE]   show or raise the fence floor (SQL stores)
//	fenced prune --older-than DURATION    delete unused keys' rows, keeping fences increasing
//	fenced demo [--no-fence]              the billing scenario, run for real
//
// The store is chosen with --store or FENCED_STORE; the default is the
// embedded SQLite file under the user's state directory.
//
// Exit codes of fenced run: the child's own code when it ran and the lease
// held; 75 when the key was held and the wait ran out (nothing ran); 77
// when the lease was lost while the child ran (the child got SIGTERM, then
// SIGKILL after --grace); 69 when the store was unavailable; 64 for usage
// errors; 1 for other errors.
package main

import (
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}
