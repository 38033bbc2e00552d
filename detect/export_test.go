package detect

// The tests that run detection over a real database are in package
// detect_test, because storage imports detect; these give them the
// unexported parts they drive or share with the tests in here.
var (
	RunDue        = (*Scheduler).runDue
	Subjects      = subjects
	NewTestLogger = newTestLogger
	SplitAddr     = splitAddr
	WaitSent      = waitSent
)
