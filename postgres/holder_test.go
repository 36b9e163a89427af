package postgres_test

const holderEnv = "FENCED_PG_HOLDER"

func runHolder() {}
