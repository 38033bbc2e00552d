package keys

// The shape of a secret and its check, for the tests of package keys_test,
// which open a real database and so cannot be package keys: storage
// imports keys for the records it holds.
const (
	KeyPrefix    = keyPrefix
	KeySecretLen = keySecretLen
)

// IsBase62 is isBase62 for package keys_test.
var IsBase62 = isBase62
