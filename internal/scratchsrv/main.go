package main

import (
	"fmt"
	"os"
	"os/signal"

	"github.com/fenced-dev/fenced/internal/testenv"
)

func main() {
	tb := testenv.NewMainTB()
	defer tb.Close()
	my := testenv.StartMySQL(tb)
	pg := testenv.StartPostgres(tb)
	fmt.Println("MYSQL", my.Socket(), my.URL())
	fmt.Println("PG", pg.URL())
	os.Stdout.Sync()
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	<-c
}
