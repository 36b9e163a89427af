package fence_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	_ "modernc.org/sqlite"
)

// openExampleDB opens a throwaway SQLite file for the examples below; the
// returned func removes it.
func openExampleDB() (*sql.DB, func()) {
	dir, _ := os.MkdirTemp("", "lockfree-")
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "x.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate")
	if err != nil {
		panic(err)
	}
	return db, func() { db.Close(); os.RemoveAll(dir) }
}

// No lease at all: a unique constraint makes the database guarantee one
// invoice per customer and period, however many workers race and however
// long any of them pauses. Every worker runs the same INSERT; exactly one
// gets a row back.
func Example_uniqueConstraintClaim() {
	db, done := openExampleDB()
	defer done()
	db.Exec(`CREATE TABLE invoices (
		invoice_id     INTEGER PRIMARY KEY AUTOINCREMENT,
		customer_id    INTEGER NOT NULL,
		billing_period TEXT NOT NULL,
		UNIQUE (customer_id, billing_period))`)

	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var id int64
			err := db.QueryRow(`INSERT INTO invoices (customer_id, billing_period) VALUES (?, ?)
				ON CONFLICT (customer_id, billing_period) DO NOTHING
				RETURNING invoice_id`, 42, "2026-11").Scan(&id)
			if err == nil { // sql.ErrNoRows: another worker created it; skip
				mu.Lock()
				winners++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var n int
	db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&n)
	fmt.Printf("workers that created the invoice: %d, invoices: %d\n", winners, n)
	// Output: workers that created the invoice: 1, invoices: 1
}

// No lease at all: the read-check-write race of "read stock, then write
// stock" disappears when the check and the decrement are one statement.
func Example_conditionalUpdate() {
	db, done := openExampleDB()
	defer done()
	db.Exec(`CREATE TABLE inventory (sku TEXT PRIMARY KEY, quantity INTEGER NOT NULL)`)
	db.Exec(`INSERT INTO inventory VALUES ('sku_1', 1)`)

	var wg sync.WaitGroup
	var mu sync.Mutex
	reserved := 0
	for buyer := 0; buyer < 5; buyer++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := db.Exec(`UPDATE inventory SET quantity = quantity - 1 WHERE sku = ? AND quantity > 0`, "sku_1")
			if err != nil {
				return
			}
			if n, _ := res.RowsAffected(); n == 1 { // 0 rows: sold out
				mu.Lock()
				reserved++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var q int
	db.QueryRow(`SELECT quantity FROM inventory WHERE sku = 'sku_1'`).Scan(&q)
	fmt.Printf("reserved: %d, stock left: %d\n", reserved, q)
	// Output: reserved: 1, stock left: 0
}

// No lease at all: a row that must be read, thought about and written back
// carries a version; the write applies only if nobody wrote since the read.
// The loser re-reads and tries again, so no update is lost.
func Example_optimisticVersioning() {
	db, done := openExampleDB()
	defer done()
	db.Exec(`CREATE TABLE accounts (account_id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)`)
	db.Exec(`INSERT INTO accounts VALUES (1, 100, 0)`)

	// deposit reads, computes in the application, and writes back only if
	// the version it read is still current; otherwise it reads again.
	deposit := func(amount int) {
		for {
			var balance, version int
			db.QueryRow(`SELECT balance, version FROM accounts WHERE account_id = 1`).Scan(&balance, &version)
			res, err := db.Exec(`UPDATE accounts SET balance = ?, version = version + 1 WHERE account_id = 1 AND version = ?`, balance+amount, version)
			if err != nil {
				continue
			}
			if n, _ := res.RowsAffected(); n == 1 {
				return
			}
			// 0 rows: someone wrote since our read.
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); deposit(10) }()
	}
	wg.Wait()
	var balance, version int
	db.QueryRow(`SELECT balance, version FROM accounts WHERE account_id = 1`).Scan(&balance, &version)
	fmt.Printf("balance %d after 5 concurrent deposits of 10, version %d\n", balance, version)
	// Output: balance 150 after 5 concurrent deposits of 10, version 5
}
