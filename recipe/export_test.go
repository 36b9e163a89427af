package recipe

// ObserveEvery is how often Observe reads the election, for the tests.
const ObserveEvery = observeEvery
