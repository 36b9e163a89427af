package fencedsqlite

// AckCap is ackCap, for the tests' bounds.
const AckCap = ackCap
