package docs

// preludes declares, per page, the names its Go snippets leave to the
// reader: the context a snippet runs in, a client opened earlier, the
// application's own functions. Each is typed as the page means it, so a
// snippet that passes it the wrong thing fails to compile. A page with Go
// snippets must have an entry here (empty if it leaves nothing out); the
// imports a prelude needs are inferred as for the snippets.
var preludes = map[string]string{
	"README.md": `
var ctx context.Context
var dbURL string // the PostgreSQL store's URL, also the application's database

// sendInvoice sends the invoice, carrying the fence with the write.
var sendInvoice func(ctx context.Context, id string, fence uint64) error

// render renders the invoice's PDF: the canonical worker's slow work.
var render func(ctx context.Context, id string) ([]byte, error)
`,
	"docs/gocron.md": `
var client *fenced.Client
var guard *fence.SQL
var sendReport func(ctx context.Context, tok fence.Token) error
`,
	"docs/guards.md": `
var ctx context.Context
var dbURL string
var render func(ctx context.Context, id string) ([]byte, error)

var client *fenced.Client
var tok fence.Token
var redisClient *redis.Client
var etcdClient *clientv3.Client

var mux *http.ServeMux
var sendHandler http.Handler
var store fence.Store

var secret []byte                                 // the signing key, shared with the resource
var h http.Handler                                // the resource's handler
var leaseKey func(*http.Request) (string, error) // the lease key of a request's resource
var rdb *redis.Client
var lease *fenced.Lease
`,
	"docs/kubernetes.md": `
var ctx context.Context
var client *fenced.Client
var identity string // this replica's name
var callbacks leaderelection.LeaderCallbacks
var work func(ctx context.Context, fence uint64) // the leader's work
`,
	"docs/metrics.md": `
var ctx context.Context
var url string // the store's URL
`,
	"docs/recipes.md": `
var ctx context.Context
var client *fenced.Client
var hostname string

// billDueCustomers bills the partition's customers, each write carrying tok.
var billDueCustomers func(ctx context.Context, partition int, tok fence.Token)

// sleepOrDone waits d or until ctx ends.
var sleepOrDone func(ctx context.Context, d time.Duration)

// billFrom bills the partition's invoices after offset, each write carrying
// tok, and returns the offset it reached.
var billFrom func(ctx context.Context, partition int, offset int64, tok fence.Token) int64
`,
	// The test's own page of known verdicts (selfCheck).
	"selfcheck.md": `
var ctx context.Context
`,
}
