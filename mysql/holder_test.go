package mysql_test

const holderEnv = "FENCED_MYSQL_HOLDER"

func runHolder() {}
