package fencedredis

// NudgeMin is nudgeMin, for the tests' bounds.
const NudgeMin = nudgeMin
